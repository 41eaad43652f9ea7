"""Input splits on 2 to 8 ranks: ``verify`` against one process in float64 for a split of the
input features alone (summed by a reduce-scatter), uneven blocks, out × in weight blocks in an
alternating chain (column then row, and back), and input splits mixed with batch and spatial
splits in a CNN."""

import pytest

from tests.test_multiaxis_on_ranks import verified
from tests.test_training_app import mpiexec

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec")

# out × in blocks whose digits swap from layer to layer: each reads its input cut as the sum
# before it leaves it
ALTERNATING = """linear1 split c=2,i=2
linear2 split i=2,c=2
linear3 split c=2,s=2
"""

# conv2: samples × height × input channels; linear1: output features by a reduce-scatter
# into a split that linear2 reads as its input split (row after row, no gather)
MIXED_ON_8 = """conv1 split n=2,h=2,c=2
conv2 split n=2,h=2,i=2
linear1 split n=2,c=2,s=2
linear2 split n=2,i=4
"""


def test_an_input_split_alone_is_summed_by_a_reduce_scatter(tmp_path):
    layouts = verified(tmp_path, 2, "mlp", "fc=s2")
    assert layouts["linear2"] == "2x1 batch/1 features/2 -> 2x1 batch/1 features/2"


def test_uneven_input_and_output_blocks_verify(tmp_path):
    """Three ranks: conv2's 16 input channels in blocks of 5, 5, 6; the classifier's 10
    outputs in 3, 3, 4; conv1 (one input channel) falls back, as /model asks, to its output
    channels."""
    layouts = verified(tmp_path, 3, "smallcnn", "conv=i3/model,fc=s3", "--image-size", "9")
    assert layouts["conv2"] == "3x1 batch/1 channels/3 -> 3x1 batch/1 replicated"
    assert layouts["linear2"] == "3x1 batch/1 features/3 -> 3x1 batch/1 features/3"


def test_an_alternating_chain_of_weight_blocks_verifies(tmp_path):
    plan = tmp_path / "alternating.plan"
    plan.write_text(ALTERNATING)
    layouts = verified(tmp_path, 4, "mlp", str(plan))
    # linear2 reads its input as linear1's sum left it
    assert layouts["relu1"].split(" -> ")[1] == layouts["linear2"].split(" -> ")[0]
    assert layouts["linear3"].endswith("features/4")


def test_input_splits_with_batch_and_spatial_splits_verify_on_eight_ranks(tmp_path):
    plan = tmp_path / "mixed.plan"
    plan.write_text(MIXED_ON_8)
    layouts = verified(tmp_path, 8, "smallcnn", str(plan), "--image-size", "10", "--batch", "6")
    assert layouts["conv2"] == ("4x2 batch/2 channels/2 height/2 -> "
                                "4x2 batch/2 height/2 replicated/2")
