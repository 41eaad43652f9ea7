"""``python -m hpctrain export``: a checkpoint's trained net as an ONNX model or a PyTorch state
dict, in one process without MPI::

    python -m hpctrain export --checkpoint ckpt/ --out model.onnx        # onnxruntime runs it
    python -m hpctrain export --checkpoint ckpt/ --out model.safetensors # load_state_dict takes it

A checkpoint holds every tensor whole whatever plan and P wrote it, and its net
(:func:`~hpctrain.run.checkpoint_file.checkpoint_net`), so nothing else is needed. ``.onnx``
writes the net in inference form with its weights and batch norm's running statistics
(:mod:`hpctrain.interchange.onnx_export`); ``.safetensors`` writes a state dict under PyTorch's
names and layouts with each batch norm's ``num_batches_tracked``
(:mod:`hpctrain.interchange.weights`): the shipped torchvision nets load into torchvision's own
models with ``strict=True``, as does any net that came from ONNX. The output is written beside
its name and renamed when complete; an existing file is replaced only when hpctrain wrote it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hpctrain.errors import ArgumentParser, UserError, shown

SUFFIXES = (".onnx", ".safetensors")


def build_parser() -> argparse.ArgumentParser:
    from hpctrain.interchange.onnx_export import OPSETS

    parser = ArgumentParser(
        prog="python -m hpctrain export",
        description="Write a checkpoint's trained net as an ONNX model (.onnx: inference form, "
                    "weights and batch-norm running statistics, runnable by onnxruntime) or a "
                    "PyTorch state dict (.safetensors: PyTorch's names and layouts; the shipped "
                    "torchvision nets load into torchvision's models with strict=True). Works "
                    "from a checkpoint of any plan and P, in one process, without MPI.",
        epilog="Exit status: 0 written; 2 bad input (one line naming it); 3 the file could not "
               "be written. An existing --out is replaced only when hpctrain wrote it.")
    parser.add_argument("--checkpoint", required=True, metavar="PATH",
                        help="a checkpoint file (step-NNNNNNNN.h5), or a --checkpoint-dir "
                             "(its newest)")
    parser.add_argument("--out", required=True, metavar="FILE",
                        help="the file to write: FILE.onnx or FILE.safetensors")
    parser.add_argument("--net", default=None,
                        help="the net the checkpoint was trained as: needed only for a "
                             "checkpoint written before checkpoints kept their net (then "
                             "shipped name, .net file or .onnx model)")
    parser.add_argument("--opset", type=int, choices=OPSETS, default=OPSETS[0],
                        help="the ONNX opset written (default: %(default)s)")
    return parser


def run(argv: list[str]) -> int:
    from hpctrain.interchange.onnx_import import ONNX_EXTRA
    from hpctrain.io.files import check_output, replace_atomically
    from hpctrain.run.checkpoint_file import checkpoint_net, resolve_resume, whole_tensors

    args = build_parser().parse_args(argv)
    out = Path(args.out)
    if out.suffix not in SUFFIXES:
        raise UserError(f"--out {shown(args.out)} must end in .onnx (an ONNX model) or "
                        f".safetensors (a PyTorch state dict)")
    path = resolve_resume(Path(args.checkpoint))
    if args.net is not None:
        from hpctrain.interchange.nets import load_network

        net = load_network(args.net)
    else:
        net = checkpoint_net(path)
    if "opset" in _given(argv) and out.suffix != ".onnx":
        raise UserError(f"--opset {args.opset} is the ONNX opset; --out {out} is a state dict")
    is_ours = _ours(out)
    check_output(out, "--out", is_ours, f"a {out.suffix} file hpctrain exported",
                 [("--checkpoint", path)])
    info, tensors = whole_tensors(path, net)
    write = _writer(out, net, tensors, info, args.opset)
    try:
        replace_atomically(out, write, ours=is_ours)
    except ImportError as err:
        raise UserError(f"writing {out} needs {err.name}; install it with {ONNX_EXTRA}"
                        ) from None
    print(f"wrote {out}: net {net.name}, step {info.step}, {len(tensors)} tensors "
          f"({net.parameter_count() / 1e6:.2f} M parameters)", flush=True)
    return 0


def _given(argv: list[str]) -> set[str]:
    return {a.lstrip("-").split("=")[0] for a in argv if a.startswith("--")}


def _ours(out: Path):
    """Whether a file at ``out`` is one hpctrain exported (its metadata say so)."""
    if out.suffix == ".onnx":
        from hpctrain.interchange.onnx_export import is_our_model

        return is_our_model
    from hpctrain.interchange.weights import is_our_state_dict

    return is_our_state_dict


def _writer(out: Path, net, tensors, info, opset: int):
    """How to write the export of ``net`` with ``tensors`` into a temporary file."""
    about = f"hpctrain net {net.name}, checkpoint {info.path.name}, step {info.step}"
    if out.suffix == ".onnx":
        from hpctrain.interchange.onnx_export import model_proto

        model = model_proto(net, tensors, opset, doc=about)

        def write(tmp: Path) -> None:
            import onnx

            onnx.save(model, str(tmp))

        return write
    from hpctrain.interchange.weights import state_dict, write_safetensors

    def write_state(tmp: Path) -> None:
        write_safetensors(tmp, state_dict(net, tensors, info.step), {"about": about})

    return write_state
