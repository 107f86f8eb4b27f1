"""hfl.data — datasets, partitioners and loaders shared by every algorithm.

Imports only numpy at module load; scikit-learn, scipy, Pillow and torch are
imported by the functions that need them, so a CLI or config check can import
this cheaply.
"""

from .builtin import builtin_names, load_builtin, register_builtin
from .dataset import ArrayDataset, TabularSchema
from .domains import domain_partition, rotate_domains, rotated_digits, rotated_mnist
from .files import load_csv, load_image_folder, load_npz
from .images import flatten, recolor, resize
from .loader import make_loader
from .partition import (
    as_generator,
    dirichlet_partition,
    iid_partition,
    split_fractions,
    train_test_split_indices,
)
from .tabular import (
    FEATURE_SPLITS,
    Standardizer,
    feature_split,
    fit_standardizer,
    numeric_mask,
    select_columns,
)
from .vision import TORCHVISION_NAMES, load_torchvision

__all__ = [
    "FEATURE_SPLITS",
    "TORCHVISION_NAMES",
    "ArrayDataset",
    "Standardizer",
    "TabularSchema",
    "as_generator",
    "builtin_names",
    "dirichlet_partition",
    "domain_partition",
    "feature_split",
    "fit_standardizer",
    "flatten",
    "iid_partition",
    "load_builtin",
    "load_csv",
    "load_image_folder",
    "load_npz",
    "load_torchvision",
    "make_loader",
    "numeric_mask",
    "recolor",
    "register_builtin",
    "resize",
    "rotate_domains",
    "rotated_digits",
    "rotated_mnist",
    "select_columns",
    "split_fractions",
    "train_test_split_indices",
]
