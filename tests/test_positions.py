"""mtrain.model.positions: rotary positions against the textbook formula, in value and gradient."""

import pytest
import torch

from mtrain.model.positions import RotaryPositions


def reference_rope(x: torch.Tensor, offset: int, base: float = 10000.0) -> torch.Tensor:
    """Su et al.'s rotation, rotate-half layout, written out: pairs (i, i + d/2) turn by pos * base^(-2i/d)."""
    _, length, _, head_dim = x.shape
    half = head_dim // 2
    frequencies = base ** (-torch.arange(half, dtype=torch.float64) * 2 / head_dim)
    angles = torch.arange(offset, offset + length, dtype=torch.float64)[:, None] * frequencies  # (length, half)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


@pytest.mark.parametrize("offset", [0, 5])
def test_rotary_matches_the_formula_and_its_gradient_is_the_inverse_rotation(offset):
    rotary = RotaryPositions(head_dim=8, max_positions=32)
    x = torch.randn(2, 6, 3, 8, dtype=torch.float64, requires_grad=True)
    reference_x = x.detach().clone().requires_grad_(True)
    out, expected = rotary(x, offset), reference_rope(reference_x, offset)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    expected.backward(upstream)
    torch.testing.assert_close(x.grad, reference_x.grad, rtol=1e-6, atol=1e-6)
    assert torch.autograd.gradcheck(lambda t: rotary(t, offset), (x.detach().clone().requires_grad_(True),))


def test_rotated_dot_products_depend_only_on_the_distance():
    rotary = RotaryPositions(head_dim=16, max_positions=64)
    q, k = torch.randn(16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)

    def score(query_position: int, key_position: int) -> float:
        rotated_q = rotary(q.view(1, 1, 1, 16), query_position)
        rotated_k = rotary(k.view(1, 1, 1, 16), key_position)
        return float((rotated_q * rotated_k).sum())

    assert score(7, 3) == pytest.approx(score(20, 16), abs=1e-5)  # fp32 angle tables
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)


def test_rotary_keeps_bf16_activations_in_bf16():
    rotary = RotaryPositions(head_dim=8, max_positions=16)
    x = torch.randn(1, 4, 2, 8).bfloat16()
    out = rotary(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), reference_rope(x.float(), 0), rtol=2e-2, atol=2e-2)


def test_position_offset_starts_the_sinusoids_at_that_row_and_needs_a_sinusoidal_table():
    """M2M100's positions start at pad_id + 1 (`model.position_offset`): position p reads row p + offset."""
    from mtrain.config import ModelConfig
    from mtrain.errors import MtrainError
    from mtrain.model.positions import SinusoidalPositions, sinusoidal_table

    shifted = SinusoidalPositions(8, 16, first_row=2)
    assert torch.equal(shifted(3, offset=1), sinusoidal_table(20, 8)[3:6])
    with pytest.raises(MtrainError, match=r"model.position_offset=2 shifts a sinusoidal table; model.positions=rope"):
        ModelConfig(positions="rope", position_offset=2).check("model")  # type: ignore[arg-type]
