"""Array type names shared by every component, so one vector type reads the same everywhere."""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import numpy.typing as npt

FloatArray: TypeAlias = npt.NDArray[np.float32]
"""Embeddings, scores and other float32 vectors or matrices."""
