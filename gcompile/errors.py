"""One error family for the Python layer: every failure gcompile reports is a GCompileError."""


class GCompileError(Exception):
    """Base class of every error gcompile raises on purpose."""


class ShapeError(GCompileError):
    """A node's inputs have shapes (or dtypes) its op cannot accept."""


class DataError(GCompileError):
    """A dataset file is missing, corrupt or does not match what was asked for."""


class BuildError(GCompileError):
    """The C++/CUDA compiler rejected generated source.

    Carries the command, the compiler's stderr and the path of the kept source."""

    def __init__(self, message, command=None, stderr="", source_path=None):
        self.command = command
        self.stderr = stderr
        self.source_path = source_path
        detail = message
        if command:
            detail += "\n  command: " + " ".join(map(str, command))
        if source_path:
            detail += f"\n  source kept at: {source_path}"
        if stderr:
            detail += "\n  compiler output:\n" + stderr.rstrip()
        super().__init__(detail)


class RuntimeFailure(GCompileError):
    """A compiled program reported an error through its C ABI."""


class PlanError(GCompileError):
    """A memory plan is unsafe: two buffers overlap while both are live, or a buffer is misplaced."""


class PerformanceWarning(UserWarning):
    """A build succeeded, but the compiler reported a slow path in gcompile's generated code (build.py:
    ptxas serialized a kernel's wgmma). The program runs and gives the same results, only slower."""
