"""optimum-cli registration for optimum-amdx: `optimum-cli amdx ...` and `optimum-cli export rocm`.

optimum-cli imports every file in the `optimum.commands.register` namespace and reads
`REGISTER_COMMANDS`. Only argument parsers are built at import; the work happens in `run()`.
A failure here must not break optimum-cli for other plugins, so it is caught and reported.
"""

import sys
import warnings

try:
    from optimum.commands.base import BaseOptimumCLICommand, CommandInfo
    from optimum.commands.export.base import ExportCommand

    from optimum_amdx.cli import main as _amdx_main

    class AmdxCommand(BaseOptimumCLICommand):
        """`optimum-cli amdx <command>`: every `optimum-amdx` subcommand."""

        COMMAND = CommandInfo(name="amdx", help="optimum-amdx: AMD GPU backend (env, generate, export, quantize, ...)")

        @staticmethod
        def parse_args(parser):
            _amdx_main.add_global_options(parser, prog="optimum-cli amdx")
            _amdx_main.add_commands(parser)

        def run(self):
            code = _amdx_main.run_parsed(self.args, self.parser)
            if code:
                sys.exit(code)

    REGISTER_COMMANDS = [AmdxCommand]

    _export = next((m for m in _amdx_main.command_modules() if m.NAME == "export"), None)
    if _export is not None:

        class ExportRocmCommand(BaseOptimumCLICommand):
            """`optimum-cli export rocm`: ONNX export for MIGraphX / ROCm EP (and CPU)."""

            COMMAND = CommandInfo(name="rocm", help=_export.HELP)

            @staticmethod
            def parse_args(parser):
                _export.add_arguments(parser)
                parser.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
                parser.set_defaults(amdx_command=_export)

            def run(self):
                code = _amdx_main.run_parsed(self.args, self.parser)
                if code:
                    sys.exit(code)

        REGISTER_COMMANDS.append((ExportRocmCommand, ExportCommand))
except Exception as _err:  # noqa: BLE001 - a broken plugin must not break optimum-cli
    warnings.warn(f"optimum-amdx could not register its optimum-cli commands: {_err!r}", stacklevel=1)
    REGISTER_COMMANDS = []
