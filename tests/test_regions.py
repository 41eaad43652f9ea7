"""Fork–join regions: post-dominators against their definition on random graphs, the regions of
the shipped nets, and forks that make no region."""

import numpy as np
import pytest

from hpctrain.model.net import load_net, parse_net
from hpctrain.model.regions import INPUT, fork_join_regions, post_dominators


def random_dag(rng: np.random.Generator, count: int) -> dict[int, tuple[int, ...]]:
    """Readers of each of ``count`` nodes in topological order: each node after the first reads
    1-3 earlier ones, so every node but the last may be read by later ones."""
    readers: dict[int, list[int]] = {}
    for k in range(1, count):
        for p in rng.choice(k, size=min(k, rng.integers(1, 4)), replace=False):
            readers.setdefault(int(p), []).append(k)
    return {p: tuple(sorted(ks)) for p, ks in readers.items()}


def reaches_exit_avoiding(readers: dict, start: int, avoid: int, count: int) -> bool:
    """Whether some path from ``start`` leaves the graph (a node nothing reads) without
    passing ``avoid``."""
    todo, seen = [start], set()
    while todo:
        k = todo.pop()
        if k == avoid or k in seen:
            continue
        seen.add(k)
        if not readers.get(k):
            return True
        todo += readers[k]
    return False


@pytest.mark.parametrize("seed", range(40))
def test_post_dominators_are_the_first_node_every_way_out_passes(seed):
    rng = np.random.default_rng(seed)
    count = int(rng.integers(2, 14))
    readers = random_dag(rng, count)
    found = post_dominators(count, readers)
    for k in range(count):
        # every later node no path out avoids post-dominates k; the first of them is immediate
        dominating = [v for v in range(k + 1, count)
                      if not reaches_exit_avoiding(readers, k, v, count)]
        assert found[k] == (dominating[0] if dominating else count), (seed, k, readers)


def names(net, region):
    return ("input" if region.fork == INPUT else net.layers[region.fork].name,
            net.layers[region.join].name)


def test_every_inception_module_is_a_region_and_two_of_them_nest_two_more():
    net = load_net("inception_v3")
    regions = fork_join_regions(net)
    modules = [r for r in regions if net.layers[r.join].name.endswith("concat1")
               or net.layers[r.join].name.endswith("concat3")]
    assert [net.layers[r.join].name.split(".")[0] for r in modules] == [
        "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b", "Mixed_6c", "Mixed_6d",
        "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c"]
    # four branches; three where the image halves (6a, 7a), one a max-pool without weights
    assert [len(r.branches) for r in modules] == [4, 4, 4, 3, 4, 4, 4, 4, 3, 4, 4]
    assert [r.weighted_branches(net) for r in modules] == [4, 4, 4, 2, 4, 4, 4, 4, 2, 4, 4]
    nested = [r for r in regions if r not in modules]
    assert len(nested) == 4
    for inner in nested:  # a 1x3 and a 3x1 convolution, inside a branch of 7b or 7c
        outer = next(r for r in modules if inner.fork in r.inside and inner.join in r.inside)
        assert len(inner.branches) == 2 and inner.weighted_branches(net) == 2
        assert set(inner.inside) < set(outer.inside)


@pytest.mark.parametrize(("name", "blocks", "downsampling"), [("resnet18", 8, 3),
                                                              ("resnet50", 16, 4),
                                                              ("resdigits", 2, 1)])
def test_every_residual_block_is_a_region_of_its_main_path_and_its_shortcut(name, blocks,
                                                                            downsampling):
    net = load_net(name)
    regions = fork_join_regions(net)
    assert len(regions) == blocks
    for region in regions:
        assert net.layers[region.join].kind == "add" and len(region.branches) == 2
    # a block whose shortcut is a convolution has two weighted branches; else the shortcut is
    # the identity, an empty branch
    two = [r for r in regions if r.weighted_branches(net) == 2]
    assert len(two) == downsampling
    assert all(r.branches[-1] == () for r in regions if r not in two)


@pytest.mark.parametrize("name", ["alexnet", "smallcnn", "cosmoflow", "mlp", "vgg16"])
def test_a_chain_has_no_region(name):
    assert fork_join_regions(load_net(name)) == []


NOT_ALONE = """input channels=1 size=8 classes=10
conv name=a out=4 kernel=3 pad=1
relu name=r
conv name=b out=4 kernel=3 pad=1
conv name=c in=r out=4 kernel=3 pad=1
add name=j in=b,c,a
flatten
linear out=10
"""


def test_a_fork_whose_join_reads_from_outside_makes_no_region():
    # r forks into b and c, joined by j, which also reads a (before r): only a's region stands
    # alone, with r, b and c as one branch and the edge from a straight into j as another
    net = parse_net(NOT_ALONE, "not-alone")
    regions = fork_join_regions(net)
    assert [names(net, r) for r in regions] == [("a", "j")]
    index = net.index
    assert regions[0].branches == ((index["r"], index["b"], index["c"]), ())
    assert regions[0].weighted_branches(net) == 1
