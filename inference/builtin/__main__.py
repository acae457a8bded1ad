"""`python -m inference.builtin --model PATH --port N [--adapter NAME=PATH]... [--dtype auto] [--cuda-graphs auto]`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from prime_lab.inference.builtin.server import CUDA_GRAPHS, DTYPES, BuiltinServerSettings, run_server


def parse_adapter(value: str) -> tuple[str, Path]:
    name, sep, path = value.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {value!r}")
    return name, Path(path)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m prime_lab.inference.builtin", description=__doc__)
    parser.add_argument("--model", required=True, type=Path, help="a Hugging Face model folder")
    parser.add_argument("--served-model-name", default=None, help="the name requests use (default: folder name)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--adapter", action="append", type=parse_adapter, default=[], metavar="NAME=PATH")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="auto: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: cuda if present)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--max-batch-rows", type=int, default=64, help="sequences decoded together at most")
    parser.add_argument("--cuda-graphs", choices=CUDA_GRAPHS, default="auto",
                        help="the decode step replayed as a CUDA graph (auto: on a GPU; off: eager decode)")
    parser.add_argument("--override-generation-config", type=json.loads, default={}, metavar="JSON",
                        help="defaults over the model's generation_config, as vLLM's flag: temperature, top_p, "
                        "top_k, max_new_tokens (a request's max_tokens when it sets none), e.g. "
                        """'{"max_new_tokens": 256}'""")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = BuiltinServerSettings(
        model=args.model,
        served_model_name=args.served_model_name,
        adapters=dict(args.adapter),
        dtype=args.dtype,
        device=args.device,
        max_model_len=args.max_model_len,
        max_batch_rows=args.max_batch_rows,
        cuda_graphs=args.cuda_graphs,
        generation_overrides=dict(args.override_generation_config),
    )
    try:
        run_server(settings, host=args.host, port=args.port)
    except KeyboardInterrupt:
        pass
    except Exception as error:  # startup failures: a model that does not load, a bad adapter
        logging.getLogger("prime_lab.inference.builtin").debug("startup failed", exc_info=True)
        print(f"Error: the built-in server could not start: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
