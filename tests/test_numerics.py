"""The study's numerics (dmlstudy.numerics): pinned by the package itself, recorded by every run, and one computation
on every x86-64 with AVX2: golden CI-sized runs whose final weights and R@1 equal committed values."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dmlstudy import numerics
from dmlstudy.paths import study_outputs

GOLDEN = Path(__file__).with_name("golden_runs.json")
PINNABLE = numerics.cpu_has_avx2()

# Trains one tiny run in a fresh process (as the CLI, a worker or a kernel would: dmlstudy imported first) and
# prints its numerics, R@1 and a digest of its final weights.
GOLDEN_SCRIPT = """
import hashlib, json, sys
import dmlstudy
from dmlstudy.run.train import TrainConfig, run
result = run(TrainConfig(**json.loads(sys.argv[1])))
state = result.method.state_dict()
digest = hashlib.sha256()
for name in sorted(state):
    digest.update(name.encode())
    digest.update(state[name].detach().contiguous().cpu().numpy().tobytes())
environment = json.loads(result.records["environment.json"].read_text())
print(json.dumps({"numerics": environment["numerics"], "R@1": result.metrics["R@1"], "weights": digest.hexdigest(),
                  "departures": environment["numerics_departures"], "cpu": environment["cpu_model"]}))
"""


def _python(code: str, *args: str, **environment: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key not in numerics.PINNED_VARIABLES}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env={**env, **environment}, timeout=600
    )


def test_the_package_pins_the_process_that_imports_it_first():
    code = "import dmlstudy, os, json, torch; x = torch.ones(3).softmax(0); from dmlstudy import numerics; print(json.dumps(numerics.observed()))"
    found = json.loads(_python(code).stdout)
    assert found["numerics_mode"] == "pinned" and found["torch_threads"] == numerics.THREADS
    if PINNABLE:
        assert found["numerics"] == numerics.PINNED_TAG, found["numerics_departures"]
        assert found["cpu_capability"] == "AVX2"
        assert found["numerics_variables"] == numerics.PINNED_VARIABLES


def test_native_numerics_are_tagged_and_publish_beside_the_runs(tmp_path):
    code = (
        "import dmlstudy, json, torch; from dmlstudy import numerics; "
        "from dmlstudy.paths import different_build_message, study_outputs; x = torch.ones(3).softmax(0); "
        "print(json.dumps([numerics.observed()['numerics'], str(study_outputs('default', 'results')), "
        "different_build_message('default')]))"
    )
    tag, results, message = json.loads(_python(code, DMLSTUDY_NUMERICS="native", DMLSTUDY_HOME=str(tmp_path)).stdout)
    assert tag.startswith("native-")
    assert Path(results) == tmp_path / "runs" / "default" / "results"
    assert message.startswith("numerics: this process runs with DMLSTUDY_NUMERICS=native") and results in message
    assert study_outputs("default", "results", runs_root_override=tmp_path) != Path(results)  # pinned: the repository's


def test_an_unknown_numerics_mode_is_an_error_that_names_the_valid_ones():
    failed = _python("import dmlstudy", DMLSTUDY_NUMERICS="fast")
    assert failed.returncode != 0 and "DMLSTUDY_NUMERICS='fast'" in failed.stderr and "pinned, native" in failed.stderr


def test_a_run_records_its_numerics_and_the_per_seed_table_carries_them(tiny_config):
    from dmlstudy.findings.claims import numerics_note, per_seed_table
    from dmlstudy.run.train import run
    from dmlstudy.study.grids import results_frame

    result = run(tiny_config(run_name="numerics"))
    environment = json.loads(result.records["environment.json"].read_text())
    assert {"numerics", "cpu_model", "cpu_capability", "torch_threads", "numerics_variables"} <= set(environment)
    assert environment["torch_threads"] == numerics.THREADS
    frame = results_frame([("ms", result)]).assign(regime="scratch")
    table = per_seed_table(frame)
    assert list(table["numerics"]) == [environment["numerics"]]
    if PINNABLE:
        assert environment["numerics"] == numerics.PINNED_TAG and numerics_note(table) == ""
    mixed = per_seed_table(pd.concat([frame.assign(numerics="native-avx512", seed=1), frame], ignore_index=True))
    assert "native-avx512 (1 runs)" in numerics_note(mixed) and environment["numerics"] in numerics_note(mixed)


def test_the_stem_cache_keeps_each_numerics_in_its_own_file():
    from dmlstudy.models.trunk_cache import StemCacheKey

    values = dict(dataset_digest="d", image_size=128, augmentation_seed=None, view=0, stem_digest="s")
    pinned, native = StemCacheKey(**values), StemCacheKey(**values, numerics="native-avx512")
    assert pinned.numerics == numerics.PINNED_TAG and pinned.file_name() != native.file_name()


@pytest.mark.skipif(not PINNABLE, reason="the golden digits are the pinned AVX2 numerics': this CPU has no AVX2")
@pytest.mark.parametrize("name", sorted(json.loads(GOLDEN.read_text())["runs"]))
def test_golden_run_gives_the_committed_weights_and_recall(name, tiny_config):
    golden = json.loads(GOLDEN.read_text())["runs"][name]
    config = tiny_config(run_name=f"golden-{name}", **golden["config"])
    values = {
        key: value
        for key, value in config.to_dict().items()
        if key in golden["config"]
        or key
        in (
            "study",
            "runs_root",
            "data_root",
            "dataset",
            "image_size",
            "classes_per_batch",
            "samples_per_class",
            "steps_per_epoch",
            "epochs",
            "eval_batch_size",
            "progress",
            "device",
            "run_name",
        )
    }
    finished = _python(GOLDEN_SCRIPT, json.dumps(values))
    assert finished.returncode == 0, finished.stderr[-3000:]
    found = json.loads(finished.stdout.strip().splitlines()[-1])
    where = f"on {found['cpu']} under numerics {found['numerics']} (departures from the pin: {found['departures'] or 'none'})"
    assert found["numerics"] == numerics.PINNED_TAG, f"golden run {name!r} did not run pinned {where}"
    assert found["weights"] == golden["weights"] and found["R@1"] == golden["R@1"], (
        f"golden run {name!r} {where} gave R@1 {found['R@1']!r} and weights {found['weights']}, the committed "
        f"{golden['R@1']!r} and {golden['weights']} were made under {golden['numerics']}: the pinned numerics "
        "no longer reproduce the study's digits here (dmlstudy.numerics)"
    )
