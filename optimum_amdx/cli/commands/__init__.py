"""One module per `optimum-amdx` subcommand.

Each module defines `NAME` (the word on the command line), `HELP` (one line),
`add_arguments(parser)` and `run(args) -> int`. Modules keep heavy imports (torch,
transformers, onnxruntime) inside `run()`, so building the parser stays fast. A new file here
is a new subcommand: `optimum_amdx.cli.main` discovers them.
"""
