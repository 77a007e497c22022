"""The optional C extension: the per-request hot path (src/servescope/_speedups.c).

Everything else is in pyproject.toml. ``optional=True``: where it cannot be compiled (no C
compiler), the install goes on and servescope runs its pure-Python classes instead.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("servescope._speedups", ["src/servescope/_speedups.c"], optional=True),
    ]
)
