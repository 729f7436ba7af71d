import numpy as np
from numpy.typing import NDArray

AES_NI: bool

def keystream(
    key: bytes, first: int, out: NDArray[np.uint64] | NDArray[np.uint8], mode: int, /
) -> None: ...
