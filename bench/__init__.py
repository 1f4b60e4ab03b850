"""`make bench`: gcompile against PyTorch and JAX on one GPU, in one run (see bench/README.md).

The modules that need torch or jax import them inside their functions, so `import bench.run` works on a
machine with neither (CI checks the table and JSON writer on fake numbers).
"""
