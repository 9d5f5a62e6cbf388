"""Where the job's Hydra config lives, and the ${ds.*} resolvers its directory names use.

Imported by every Hydra entry point (distributed_spec.generate, distributed_spec.plan) and the
benchmarks that compose conf/ themselves; importing it registers the resolvers.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import OmegaConf

PACKAGE_DIR = Path(__file__).resolve().parent
# conf/ sits at the repository root, beside the package (a source checkout or an editable install);
# DISTRIBUTED_SPEC_CONF_DIR points elsewhere.
CONF_DIR = Path(os.environ.get("DISTRIBUTED_SPEC_CONF_DIR", PACKAGE_DIR.parent / "conf")).resolve()


def _register_resolvers() -> None:
    # ${ds.asset:name}: a file shipped in distributed_spec/assets; ${ds.stem:path}: a file's stem.
    OmegaConf.register_new_resolver("ds.asset", lambda name: str(PACKAGE_DIR / "assets" / name), replace=True)
    OmegaConf.register_new_resolver("ds.stem", lambda path: Path(str(path)).stem, replace=True)
    # ${ds.draft_len:method,num_draft_tokens,schedule,max_draft_len,threshold,num_paths}: the
    # draft-length settings as VerifierConfig.describe_draft_len writes them everywhere ("d4", "d4a8",
    # "dgp8", then "c0.4" with the confidence stop and "k2" with 2 paths; "d0" for the baseline).
    OmegaConf.register_new_resolver("ds.draft_len", _draft_len_dir_name, replace=True)
    # ${ds.proposer:proposer,ngram_min,ngram_max}: "" for the draft model (the directories of runs
    # from before proposers existed), "-ngram1-3" / "-model+ngram1-3" otherwise.
    OmegaConf.register_new_resolver("ds.proposer", _proposer_dir_name, replace=True)


def _draft_len_dir_name(method, num_draft_tokens, schedule, max_draft_len, threshold, num_paths) -> str:
    from distributed_spec.engine.config import VerifierConfig

    return VerifierConfig(
        method=method,
        num_draft_tokens=num_draft_tokens,
        draft_len_schedule=schedule,
        max_draft_len=max_draft_len,
        draft_confidence_threshold=threshold,
        num_paths=num_paths,
    ).describe_draft_len()


def _proposer_dir_name(proposer, ngram_min, ngram_max) -> str:
    return "" if proposer == "model" else f"-{proposer}{ngram_min}-{ngram_max}"


_register_resolvers()
