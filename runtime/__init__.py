"""C/CUDA runtime files inlined into every generated program (shipped as package data gcompile.runtime)."""
