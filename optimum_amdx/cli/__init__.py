"""The `optimum-amdx` command line and the pieces `optimum-cli amdx` reuses."""
