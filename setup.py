"""The one compiled part of zerosum; everything else is in pyproject.toml.

``noise._tag_sums`` computes the aggregate check's tags in one pass over the
words (noise/_tag_sums.c, used by ``noise.aggregate_check.tags``). It is
optional: where no C compiler is found the install goes on, and the tags take
the numpy path, with the same results.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "noise._tag_sums",
            sources=["noise/_tag_sums.c"],
            optional=True,
            extra_compile_args=["-O3"],
        )
    ]
)
