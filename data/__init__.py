"""hfl.data — datasets, partitioners and loaders shared by every algorithm.

Imports only numpy at module load; scikit-learn and torch are imported by the
functions that need them, so a CLI or config check can import this cheaply.
"""

from .builtin import builtin_names, load_builtin, register_builtin
from .dataset import ArrayDataset
from .files import load_csv, load_npz
from .loader import make_loader
from .partition import as_generator, dirichlet_partition, iid_partition, train_test_split_indices

__all__ = [
    "ArrayDataset",
    "as_generator",
    "builtin_names",
    "dirichlet_partition",
    "iid_partition",
    "load_builtin",
    "load_csv",
    "load_npz",
    "make_loader",
    "register_builtin",
    "train_test_split_indices",
]
