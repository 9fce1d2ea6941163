"""latentstruct: learning with discrete latent structure.

A model's middle is a discrete choice z = argmax_z <s, z> over a structure (a cluster, a tree, a tagging, a matching,
a top-k set). latentstruct separates *what* z can be (``latentstruct.structures``) from *how gradients cross the
argmax* (``latentstruct.estimators``) so that every estimator is written once and works on every structure.
"""

__version__ = "0.1.0"
