# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Train one method on one dataset
#
# **This notebook executed by the published study** (the comparison's MS run of seed 0 on emoji, with
# EfficientNet-Lite0 and its ImageNet weights at 128 px): [`published/01_train.ipynb`](../published/01_train.ipynb).
# Executed without a plan it trains a CI-sized run: a 4-conv network from random initialisation on 16 SynBirds
# classes, for seconds.
#
# The protocol of the study in one notebook: class-balanced batches (P classes × M images), a backbone
# from timm, a method from `dmlstudy.methods`, evaluation on the **unseen** test classes (zero-shot, as in
# CUB-200-2011) every `eval_every` epochs, and a run folder `runs/<study>/<run_name>/` holding
# `config.yaml`, `history.csv`, `metrics.json`, the test embeddings and a checkpoint.
#
# The parameters below mirror `dmlstudy.experiments.one_run.OneRun`: `dmlstudy.run.train.TrainConfig` field by
# field, and `study_plan`, which makes the run a study's run of `method` on `dataset` with `seed`, resolved from that
# plan's protocol and tuned values as its comparison trains it (`plans/default.yaml`'s `train` entry). Their defaults
# are a CI-sized run (seconds); the plans inject real sizes, e.g.
#
# ```
# papermill notebooks/01_train.ipynb out.ipynb -p method triplet -p epochs 12 -p train_classes 0 -p test_classes 0 -p steps_per_epoch 0
# ```

# %% tags=["parameters"]
runs_root: str = ''  # default: <project>/runs
data_root: str = ''  # default: <project>/data; a dataset lives in <data_root>/<dataset>
backbone: str = 'dml_convnet'  # any timm model name (dmlstudy list backbones), the same for every method of a table
image_size: int = 64  # training crop and test centre-crop size in pixels
embedding_dim: int = 128  # d, the inference embedding size of every method
classes_per_batch: int = 16  # P of a P × M class-balanced batch
samples_per_class: int = 4  # M of a P × M class-balanced batch
epochs: int = 2  # training epochs; with patience, the cap
steps_per_epoch: int = 6  # 0: a full pass over the training classes per epoch (len(train) // (P·M) batches)
train_classes: int = 16  # 0: all training classes; n: only the first n (CI-sized runs)
test_classes: int = 16  # 0: all test classes; n: only the first n
lr: float = 0.004  # learning rate of the backbone and embedding (a row's tuned value replaces it; a tuning search starts from it)
eval_every: int = 1  # evaluate every n epochs (and after the last): validation classes, else the test classes
validation_folds: int = 0  # 0: none, test classes evaluated every eval_every epochs; n ≥ 2: the training classes in n class-disjoint folds
patience: int = 0  # with validation folds: stop after this many evaluations without a better validation R@1 (0: train all epochs)
autocast: str = 'auto'  # precision: auto (bfloat16 on CUDA, float32 on CPU), bf16 or off
study: str = 'notebook-01_train'  # runs are written to <runs_root>/<study>/<run folder>/ (see run_name)
run_name: str = ''  # folder label, default <dataset>-<method>-seed<seed>; the config hash is appended
dataset: str = 'synbirds'  # a registered dataset name (dmlstudy list datasets)
method: str = 'ms'  # a registered method name (dmlstudy list methods); default the baseline
method_kwargs: dict = {}  # keyword arguments of the method (e.g. {"K1": 16})
pretrained: bool = False  # timm's pretrained weights (Hugging Face cache; timm downloads them once when online)
checkpoint_path: str = ''  # local backbone weights file, loaded after construction (relative: from the working directory, else the project root)
freeze_bn: bool = False  # freeze BatchNorm statistics and affine parameters of the backbone
conv_head: bool = True  # with stem_views: end with EfficientNet's 1 × 1 conv_head (False: the last block's output is the feature map)
stem_views: int = 0  # n ≥ 1: an EfficientNet trained from its last stage on cached activations of its frozen stem, n training views
output_stride: int = 0  # 0: the backbone's own; 8/16 for dilated ResNets (larger feature grid)
optimizer: str = 'adamw'  # adam, adamw or sgd
head_lr: float = 0.01  # learning rate of proxies / class centres
backbone_lr_scale: float = 1.0  # the backbone trains at lr × this (< 1 when fine-tuning a pretrained backbone)
warmup_epochs: int = 0  # the first n epochs train only what the method adds to the backbone (backbone frozen)
weight_decay: float = 0.0001  # weight decay of the backbone and embedding
lr_schedule: str = 'cosine'  # constant or cosine (per epoch, to 1 % of lr)
validation_fold: int = 0  # the fold held out of training as validation classes (checkpoint choice, patience)
final_test: bool = True  # with validation folds: read the test classes once, with the best-validation state (False: never)
recall_ks: list = []  # Recall@K list; empty: the dataset's standard list
eval_batch_size: int = 64  # images per forward pass when embedding validation and test sets
num_workers: int = -1  # DataLoader worker processes of the file pipeline; -1: min(8, cores)
seed: int = 0  # seeds model init, batches and augmentation
device: str = 'auto'  # auto (CUDA when present), cpu, cuda or cuda:<i>
sync_bn: bool = False  # SyncBatchNorm across ranks under torchrun (GPU); or use freeze_bn
resume: bool = False  # continue an interrupted run from its last epoch checkpoint
overwrite: bool = False  # replace the run folder's records (a finished run is otherwise loaded, not retrained)
progress: bool = False  # tqdm progress bars
input_pipeline: str = 'auto'  # auto (tensor when it fits), tensor (cached uint8 tensor, batched augmentation) or files (per-item PIL)
tensor_budget_gib: float = 2.0  # auto: the tensor pipeline only when all splits of the run fit in this many GiB
channels_last: bool = False  # channels_last memory format (faster on CPU, but not bit-identical across resume and ranks)
compile: bool = False  # torch.compile the training step (see benchmarks/README.md for when it pays)
study_plan: str = ''  # a study plan (plans/default.yaml): the run is its run of `method` on `dataset` with `seed` as it resolves it; empty: none

# %%
from dmlstudy import plots
from dmlstudy.experiments.one_run import OneRun
from dmlstudy.records import seed_everything
from dmlstudy.run.data import load_datasets
from dmlstudy.run.train import run

config = OneRun.from_namespace(globals()).resolved()
seed_everything(config.seed)
result = run(config)
{name: round(value, 4) if isinstance(value, float) else value for name, value in result.metrics.items()}

# %% [markdown]
# ## Training curves
#
# The loss should fall; test Recall@1 is measured on classes the model never saw in training, so it can
# plateau (or dip) while the loss keeps falling — that gap is what deep metric learning is about.

# %%
figure = plots.training_curves(result.history, title=f"{config.method} on {config.dataset}")
# %% [markdown]
# ## Recall@K
#
# Recall@K is the share of test queries with at least one same-class image among their K nearest
# neighbours (cosine similarity; the query itself is excluded).

# %%
figure = plots.recall_curve(result.metrics, title=f"{config.method} on {config.dataset}")
# %% [markdown]
# ## Queries and their top-5 retrievals
#
# Solid blue frame: same class as the query; dashed vermillion: a different class. Fine-grained errors (a neighbouring class
# differing in one part) are the interesting ones.

# %%
evaluation = load_datasets(config)
figure = plots.retrieval_grid(
    evaluation["query"],
    result.embeddings["embeddings"],
    result.embeddings["labels"],
    num_queries=5,
    top_k=5,
    seed=config.seed,
)
# %% [markdown]
# ## Singular-value spectrum
#
# Singular values of the (uncentred) matrix of L2-normalised test embeddings, normalised to sum 1.
# ρ = KL(uniform ‖ spectrum) is the *spectral decay*: small ρ means the embedding uses many directions
# (a flatter spectrum), which Roth et al. relate to better generalisation to unseen classes.

# %%
figure = plots.spectrum({config.method: result.embeddings["embeddings"]}, drop_first=0)
