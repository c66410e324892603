"""Build the REST datastore of a model for ``ngrammys`` / ``ngrammys-history`` (key
``datastore``): ShareGPT first answers in the model's tokens, indexed when loaded.

    python tools/build_datastore.py --model smollm2-135m --out STORE.safetensors [--install]
    python tools/build_datastore.py --model smollm2-135m --corpus CORPUS --out OWN.safetensors

``--corpus`` takes the model's own greedy answers from a corpus folder (``tools/corpus.py``)
instead of ShareGPT's (ChatGPT's) answers.

The file (safetensors) is stamped with the model's fingerprint and vocabulary size; the
methods refuse it for any other model. ``--install`` also caches it where
``ngrammys-history`` finds it by default (it builds one there at start-up otherwise).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from vllm_selfspec.proposers.datastore import DEFAULT_DATASTORE_TOKENS


def main(argv: list[str] | None = None) -> dict[str, object]:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="alias, local folder or hub name")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_DATASTORE_TOKENS)
    p.add_argument("--out", required=True, help="datastore file (.safetensors)")
    p.add_argument("--corpus", default=None,
                   help="a corpus folder of the model's own answers (tools/corpus.py)")
    p.add_argument("--install", action="store_true",
                   help="also cache it as this model's default datastore")
    args = p.parse_args(argv)
    from tqdm import tqdm

    from vllm_selfspec.assets import resolve_model
    from vllm_selfspec.builders.datastore import build_datastore
    from vllm_selfspec.model_info import stamp_from_path
    from vllm_selfspec.proposers.artifacts import artifact_path

    path = resolve_model(args.model)
    stamp = stamp_from_path(path)
    if args.corpus:
        from vllm_selfspec.offline import corpus
        from vllm_selfspec.proposers.datastore import Datastore

        corpus.check_stamp(Path(args.corpus), stamp, corpus.read_limits(Path(args.corpus)))
        tokens, meta = corpus.datastore_tokens(Path(args.corpus), args.max_tokens, path)
        store = Datastore(tokens, stamp, meta, "corpus")
    else:
        store = build_datastore(path, stamp, args.max_tokens,
                                lambda it: tqdm(it, desc="tokenizing ShareGPT answers"))
    store.save(args.out)
    report = {"out": args.out, **store.meta, "memory_bytes": store.memory_bytes()}
    if args.install:
        dest = artifact_path("datastore", stamp)
        if dest is not None:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(args.out, dest)
            report["installed"] = str(dest)
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
