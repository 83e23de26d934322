"""Build hook for the optional C fast path of the decoder (kinspect/codec/_native.c).

Everything else is in pyproject.toml. ``optional=True``: where no C compiler is
available the build goes on and kinspect uses its generated Python decoder alone
(the test suite fails loudly in that case unless KINSPECT_NATIVE=0 says it is meant).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("kinspect.codec._native", ["kinspect/codec/_native.c"],
                             optional=True, extra_compile_args=["-O2", "-Wall"])])
