"""Writes notebooks/01_train.ipynb (run: python tools/make_01_train.py)."""
from nbtools import build_notebook, parameter_lines

from dmlstudy.train import TrainConfig

# TrainConfig's defaults are the CI-sized run; the notebook only turns the tqdm bars off (their output varies).
NOTEBOOK_OVERRIDES = {"study": "notebooks", "progress": False}

build_notebook([
    ("md", """
    # Train one method on one dataset

    The protocol of the study in one notebook: class-balanced batches (P classes × M images), a backbone
    from timm, a method from `dmlstudy.methods`, evaluation on the **unseen** test classes (zero-shot, as in
    CUB-200-2011) every `eval_every` epochs, and a run folder `runs/<study>/<run_name>-<config hash>/` holding
    `config.yaml`, `history.csv`, `metrics.json`, the test embeddings and a checkpoint.

    The parameters below mirror `dmlstudy.train.TrainConfig` field by field. Their defaults are a
    CI-sized run (seconds); the study's plans inject real sizes, e.g.

    ```
    papermill notebooks/01_train.ipynb out.ipynb -p method triplet -p epochs 12 -p train_classes 0 -p test_classes 0 -p steps_per_epoch 0
    ```
    """),
    ("parameters", parameter_lines(TrainConfig, NOTEBOOK_OVERRIDES)),
    ("code", """
    from dmlstudy import plots
    from dmlstudy.records import seed_everything
    from dmlstudy.train import TrainConfig, load_datasets, run

    config = TrainConfig.from_namespace(globals())
    seed_everything(config.seed)
    result = run(config)
    {name: round(value, 4) for name, value in result.metrics.items()}
    """),
    ("md", """
    ## Training curves

    The loss should fall; test Recall@1 is measured on classes the model never saw in training, so it can
    plateau (or dip) while the loss keeps falling — that gap is what deep metric learning is about.
    """),
    ("code", "plots.training_curves(result.history, title=f'{config.method} on {config.dataset}');"),
    ("md", """
    ## Recall@K

    Recall@K is the share of test queries with at least one same-class image among their K nearest
    neighbours (cosine similarity; the query itself is excluded).
    """),
    ("code", "plots.recall_curve(result.metrics, title=f'{config.method} on {config.dataset}');"),
    ("md", """
    ## Queries and their top-5 retrievals

    Green frame: same class as the query; red: a different class. Fine-grained errors (a neighbouring class
    differing in one part) are the interesting ones.
    """),
    ("code", """
    evaluation = load_datasets(config)
    plots.retrieval_grid(evaluation["query"], result.embeddings["embeddings"], result.embeddings["labels"], num_queries=5, top_k=5, seed=config.seed);
    """),
    ("md", """
    ## Singular-value spectrum

    Singular values of the (uncentred) matrix of L2-normalised test embeddings, normalised to sum 1.
    ρ = KL(uniform ‖ spectrum) is the *spectral decay*: small ρ means the embedding uses many directions
    (a flatter spectrum), which Roth et al. relate to better generalisation to unseen classes.
    """),
    ("code", """
    plots.spectrum({config.method: result.embeddings["embeddings"]}, drop_first=0);
    """),
], "notebooks/01_train.ipynb")
