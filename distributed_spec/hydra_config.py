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
    # ${ds.gamma:gamma,schedule,max_gamma,threshold}: "g4" for a constant g, "g4a8" for adaptive from
    # 4 up to 8, "gp4" for goodput up to 4, then "c0.4" when the draft's confidence stop is on and
    # "k2" with 2 draft paths per row.
    OmegaConf.register_new_resolver("ds.gamma", _gamma_dir_name, replace=True)
    # ${ds.proposer:proposer,ngram_min,ngram_max}: "" for the draft model (the directories of runs
    # from before proposers existed), "-ngram1-3" / "-model+ngram1-3" otherwise.
    OmegaConf.register_new_resolver("ds.proposer", _proposer_dir_name, replace=True)


def _gamma_dir_name(gamma, schedule, max_gamma, confidence_threshold, num_paths=1) -> str:
    name = {"constant": f"g{gamma}", "adaptive": f"g{gamma}a{max_gamma}", "goodput": f"gp{max_gamma}"}[schedule]
    name += f"c{confidence_threshold}" if confidence_threshold else ""
    return name + (f"k{num_paths}" if num_paths != 1 else "")


def _proposer_dir_name(proposer, ngram_min, ngram_max) -> str:
    return "" if proposer == "model" else f"-{proposer}{ngram_min}-{ngram_max}"


_register_resolvers()
