"""Developer tools that are not part of the runtime: nothing in the package imports this subpackage.

- `python -m optimum_amdx.devtools.amd_compile`: the ahead-of-time AMD compile check of every
  Triton kernel (gfx90a, gfx942, gfx950, gfx1100) and its committed per-Triton-version tables.

It lives inside the package (not a top-level tools/ folder) so that `python -m` works from any
install, including a wheel on a ROCm machine, and so tests import it like any module; it depends on
`kernels` and `hardware`, never the other way round.
"""
