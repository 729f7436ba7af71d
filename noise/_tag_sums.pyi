import numpy as np
from numpy.typing import NDArray

def tag_sums(
    words: NDArray[np.uint64], rho: NDArray[np.uint64], out: NDArray[np.uint64], /
) -> None: ...
