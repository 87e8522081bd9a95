"""The study's numerics: one floating-point computation on every x86-64 CPU with AVX2.

A run's digits depend on which kernels compute it, and the libraries under torch choose their kernels by the
CPU they find: an AVX-512 machine and an AVX2-only machine give different R@1 for the same run identity (77
of 84 per-seed rows of the default study differ, by up to 4 points, and verdicts move). The study therefore
pins its kernels to AVX2, which every x86-64 CPU of the last decade has, and gives each process one intra-op
thread, so the numbers depend on neither the CPU's vector width nor its core count nor where a schedule puts a
run. A bigger machine runs more runs at once instead (a plan's ``workers``).

:func:`configure` sets the variables below in ``os.environ`` when ``dmlstudy`` is imported, before torch,
numpy or faiss is (this module imports none of them), so every process the study starts inherits them: the
CLI's Dask workers, papermill kernels and tests' subprocesses. Each variable, and the evidence for it (torch
2.14.1, numpy 2.4.6, faiss-cpu 1.15.1; digests of the same inputs on one AVX-512 AMD EPYC, natively and pinned):

* ``ATEN_CPU_CAPABILITY=avx2`` — ATen's vectorised kernels (softmax, reductions, elementwise) from their AVX2
  build. A softmax over 1,000 logits differs between the AVX-512 and the AVX2 build. torch reads it at its first
  kernel dispatch, not at import.
* ``ONEDNN_MAX_CPU_ISA=AVX2`` — oneDNN's convolutions no wider than AVX2. The frozen EfficientNet stem's
  activations differ between oneDNN's AVX-512 and AVX2 kernels, and ATen's capability does not change them.
* ``MKL_CBWR=AVX2`` — oneMKL's conditional numerical reproducibility at its AVX2 branch. On Intel CPUs it
  fixes the code path of MKL's BLAS (torch's matrix products); on AMD CPUs MKL reports ``CNR:AUTO`` and takes
  its generic path whatever this says, so there it changes nothing. Not measured on an Intel CPU.
* ``OPENBLAS_CORETYPE=Haswell`` — the OpenBLAS inside numpy (and scikit-learn's k-means of NMI) on its AVX2
  kernels: single- and double-precision matrix products differ between its SkylakeX (AVX-512) and Haswell
  kernels. On AVX2-only AMD CPUs OpenBLAS would pick its Zen kernels, which are the Haswell ones.
* faiss (the kNN of every metric) dispatches its kernels at run time: :func:`pin_process` sets its SIMD level to
  AVX2 (``AVX512_VPOPCNT`` natively on an AVX-512 EPYC); ``FAISS_OPT_LEVEL=AVX2`` does the same for faiss builds
  that ship one library per instruction set instead.
* ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` = 1, and :func:`pin_process` sets torch's
  and faiss's intra-op threads to 1 when a run starts (a worker or kernel may have changed them): LayerNorm's
  weight gradient differs between 1 and 2 threads (its reduction is split over the threads), and with it every
  cross-attention run; a schedule used to give a run 1 or 2 threads by where it landed.

``DMLSTUDY_NUMERICS=native`` opts out (each library's own kernels, all cores: faster on a big machine); runs made
so carry the tag ``native-<capability>`` in ``environment.json`` and in the per-seed tables, and a study whose runs
carry another tag than the published one writes its outputs beside its runs (:func:`dmlstudy.paths.study_outputs`).
A process whose libraries had already chosen their kernels before ``dmlstudy`` was imported (a notebook that did
tensor work first) is found out by :func:`observed`, and its runs are tagged by what they actually used.

On a GPU the kernels are the GPU's: the tag is ``cuda``, and its verdicts are comparable, its digits are not.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any

MODE_VARIABLE = "DMLSTUDY_NUMERICS"  # "pinned" (the default) or "native"
MODES = ("pinned", "native")
PINNED_TAG = "pinned-avx2"  # the numerics of the published study
THREADS = 1  # intra-op threads of every process under the pinned numerics
PINNED_VARIABLES = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",
    "FAISS_OPT_LEVEL": "AVX2",
    "OMP_NUM_THREADS": str(THREADS),
    "MKL_NUM_THREADS": str(THREADS),
    "OPENBLAS_NUM_THREADS": str(THREADS),
}


def mode() -> str:
    """``pinned`` unless ``DMLSTUDY_NUMERICS`` says ``native``; any other value is an error that lists both."""
    value = os.environ.get(MODE_VARIABLE, "pinned").strip().lower() or "pinned"
    if value not in MODES:
        raise ValueError(f"{MODE_VARIABLE}={value!r}: expected one of {', '.join(MODES)}")
    return value


def cpu_has_avx2() -> bool:
    """Whether this CPU runs AVX2 code: an x86-64 whose flags (``/proc/cpuinfo`` on Linux) name ``avx2``; where
    the flags cannot be read, any x86-64 (torch then reports the capability it found, :func:`observed`)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        text = Path("/proc/cpuinfo").read_text(errors="ignore")
    except OSError:
        return True
    return " avx2" in text or "\tavx2" in text


def configure() -> str:
    """Set the pinned variables in ``os.environ`` (overriding what the environment had) unless the mode is
    ``native`` or the CPU has no AVX2; returns the mode in force. Called by ``import dmlstudy``."""
    chosen = mode()
    if chosen == "pinned" and cpu_has_avx2():
        os.environ.update(PINNED_VARIABLES)
    return chosen


def pin_process() -> None:
    """Under the pinned numerics, torch's and faiss's intra-op threads to :data:`THREADS` and faiss's SIMD level
    to AVX2 (called when a run, a plan task or a stem cache starts: a worker or a notebook may have set others)."""
    if mode() != "pinned":
        return
    import faiss
    import torch

    torch.set_num_threads(THREADS)
    faiss.omp_set_num_threads(THREADS)
    if faiss.SIMDConfig.is_simd_level_available(faiss.SIMDLevel_AVX2):
        faiss.SIMDConfig.set_level(faiss.SIMDLevel_AVX2)


def _faiss_level() -> str | None:
    """The SIMD level of faiss's kernels in this process (``AVX2``, ``AVX512``, …), None when faiss is not loaded."""
    if "faiss" not in sys.modules:
        return None
    return str(sys.modules["faiss"].SIMDConfig.get_level_name())


def _openblas_cores() -> list[str]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return sorted(
        {str(info.get("architecture")) for info in threadpool_info() if info.get("internal_api") == "openblas"}
    )


def observed(device: str = "cpu") -> dict[str, Any]:
    """What this process computes with, read from the libraries themselves, and its numerics tag: ``pinned-avx2``
    when every pinned choice took effect, ``cuda`` on a GPU, else ``native-<torch's CPU capability>`` (with
    ``departures`` naming what differs from the pin)."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    threads = torch.get_num_threads()
    faiss_level = _faiss_level()
    openblas = _openblas_cores()
    departures = []
    if capability != "AVX2":
        departures.append(f"torch capability {capability}")
    if threads != THREADS:
        departures.append(f"{threads} torch threads")
    if faiss_level not in (None, "AVX2"):
        departures.append(f"faiss level {faiss_level}")
    if any(core != "Haswell" for core in openblas):
        departures.append(f"OpenBLAS core {'/'.join(openblas)}")
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA")
    if onednn != PINNED_VARIABLES["ONEDNN_MAX_CPU_ISA"]:
        departures.append(f"oneDNN ISA {onednn or 'uncapped'}")
    if device.startswith("cuda"):
        tag = "cuda"
    elif mode() == "pinned" and not departures:
        tag = PINNED_TAG
    else:
        tag = f"native-{capability.lower()}"
    return {
        "numerics": tag,
        "numerics_mode": mode(),
        "cpu_model": cpu_model(),
        "cpu_capability": capability,
        "torch_threads": threads,
        "faiss_level": faiss_level,
        "openblas_cores": openblas,
        "numerics_departures": departures,
        "numerics_variables": {name: os.environ.get(name) for name in PINNED_VARIABLES},
    }


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), with its family and whether it has AVX-512."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="ignore")
    except OSError:
        return platform.processor() or platform.machine()
    fields = {
        key.strip(): value.strip()
        for key, _, value in (line.partition(":") for line in text.splitlines()[:40])
        if not key.startswith("flags")
    }
    name = fields.get("model name", "").strip() or platform.machine()
    family = fields.get("cpu family", "").strip()
    wide = "AVX-512" if " avx512f" in text else "AVX2" if " avx2" in text else "no AVX2"
    return f"{name} (family {family}, {wide})" if family else f"{name} ({wide})"
