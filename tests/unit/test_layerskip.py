"""LayerSkip's early exit as a skip mask, and its proposer's fixed draft length
(LayerSkip §4.2, §4.3.1)."""

import pytest

from vllm_selfspec.proposers.layerskip import (
    EarlyExitProposer,
    default_exit_layer,
    early_exit_mask,
)
from vllm_selfspec.proposers.resolved import Artifacts
from vllm_selfspec.proposers.skip_mask import SkipMaskError


def test_mask_skips_every_sub_layer_from_the_exit_on():
    m = early_exit_mask(3, 8)
    assert m.attention == m.mlp == frozenset(range(3, 8))
    assert m.metadata["exit_layer"] == 3 and m.kept_fraction(8) == pytest.approx(3 / 8)
    assert early_exit_mask(8, 8).num_skipped == 0  # E = L: the draft is the model


@pytest.mark.parametrize("bad", [0, 9, -1, 2.5, True, None])
def test_exit_layer_out_of_range(bad):
    with pytest.raises(SkipMaskError, match=r"exit_layer must be an integer in \[1, 8\]"):
        early_exit_mask(bad, 8)


def test_default_exit_layer_is_a_quarter_of_the_depth():
    assert [default_exit_layer(n) for n in (1, 2, 16, 30, 32, 80)] == [1, 1, 4, 8, 8, 20]


def test_fixed_number_of_speculations_unless_a_stop_threshold_is_given():
    p = EarlyExitProposer(6, {}, Artifacts(skip_mask=early_exit_mask(2, 4)))
    assert p.exit.threshold == 0.0 and not p.exit.cfg.adaptive
    p.exit.observe(6, 0)  # no adaptive update: LayerSkip's d is fixed
    assert p.exit.threshold == 0.0 and p.exit_layer == 2
    assert "no confidence stop" in p.describe()
    q = EarlyExitProposer(6, {"stop_threshold": 0.5}, Artifacts(skip_mask=early_exit_mask(2, 4)))
    assert q.exit.threshold == 0.5 and "0.50" in q.describe()
