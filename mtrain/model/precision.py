"""The dtype a sublayer computes in: autocast's dtype when autocast is on.

Each sublayer (attention, feed-forward) casts its input once on entry with
`to_compute_dtype`. Autocast casts the input of every Linear separately and never caches
activation casts: without this, an input feeding several Linears would be cast once per
Linear (and its gradient cast back as many times). The residual stream itself stays fp32.
"""

from __future__ import annotations

import torch
from torch import Tensor


def to_compute_dtype(x: Tensor) -> Tensor:
    """x in autocast's dtype when autocast is on, else x."""
    device = x.device.type
    if torch.is_autocast_enabled(device):
        return x.to(torch.get_autocast_dtype(device))
    return x
