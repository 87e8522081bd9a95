"""The method registry drives what a method shows: labels, groups, the comparison's rows; every module of
``dmlstudy/methods`` is found by itself, and a method in a module outside the package (a plugin named in
``DMLSTUDY_METHOD_MODULES``) appears in the comparison table of a tiny run."""

import pkgutil
import sys
import textwrap

import pytest

import dmlstudy.methods as methods
from dmlstudy.experiments import compare, tables
from dmlstudy.methods import GROUPS, METHOD_INFO, METHODS, list_methods, method_info, register_method
from dmlstudy.rows import classic_rows, main_rows, method_label, rows_markdown

PLUGIN = textwrap.dedent('''
    """A sixth method in one file: GeM pooling and Proxy-Anchor, registered with its label and group."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from dmlstudy.losses import build_loss
    from dmlstudy.methods import Method, register_method


    @register_method("throwaway_gem", label="Proxy-Anchor on GeM (test)", group="classic", paper="none (a test)")
    class ThrowawayGeM(Method):
        """Generalised-mean pooling, a linear embedding and the Proxy-Anchor loss."""

        def __init__(self, backbone, *, embedding_dim=128, num_classes, power=3.0):
            super().__init__(backbone, embedding_dim=embedding_dim)
            self.power = power
            self.embedding = nn.Linear(backbone.num_features, embedding_dim)
            self.criterion = build_loss("proxyanchor", num_classes=num_classes, embedding_dim=embedding_dim)

        def forward(self, images):
            maps = self.backbone(images).clamp_min(1e-6).pow(self.power)
            return F.normalize(self.embedding(maps.mean(dim=(2, 3)).pow(1.0 / self.power)), dim=1)

        def loss(self, images, labels):
            value = self.criterion(*self.gather(self(images), labels))
            return value, {"proxyanchor": float(value.detach())}

        def head_parameters(self):
            return list(self.criterion.parameters())
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The plugin module on sys.path and in DMLSTUDY_METHOD_MODULES; unregistered afterwards."""
    (tmp_path / "throwaway_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(methods.PLUGIN_VARIABLE, "throwaway_plugin")
    yield "throwaway_gem"
    METHODS.pop("throwaway_gem", None)
    METHOD_INFO.pop("throwaway_gem", None)
    sys.modules.pop("throwaway_plugin", None)


def test_every_module_of_the_package_is_registered_without_a_hand_list():
    modules = {module.name for module in pkgutil.iter_modules(methods.__path__)} - {"base"}
    assert {f"dmlstudy.methods.{name}" for name in modules} <= set(sys.modules)
    assert "from dmlstudy.methods import baseline" not in open(methods.__file__).read()
    assert {"ms", "crt", "diml", "cross_attention", "dgcrl", "triplet"} <= set(list_methods())


def test_labels_and_groups_come_from_the_registration():
    assert method_info("crt").label == "CRT" and method_info("crt").group == "paper"
    assert method_info("ms").label == "MS baseline" and method_info("ms").group == "classic"
    paper = list_methods(group="paper")  # the papers' methods, from the registry: a new one joins without an edit here
    assert {"crt", "diml", "cross_attention", "dgcrl"} <= set(paper)
    assert paper == sorted(name for name, info in METHOD_INFO.items() if info.group == "paper")
    assert all(method_info(name).paper for name in paper) and set(paper) <= set(main_rows())
    assert set(list_methods(group="paper")) | set(list_methods(group="classic")) == set(list_methods())
    assert all(method_info(name).summary for name in list_methods())
    assert method_label("lifted") == "lifted structure" and method_label("diml_rerank") == "MS + DIML re-ranking"
    assert set(classic_rows()) == set(list_methods(group="classic")) - {"ms"}
    with pytest.raises(ValueError, match="group must be one of"):
        register_method("nope", group="other")
    with pytest.raises(KeyError, match="unknown method 'nope'"):
        method_info("nope")
    assert set(GROUPS) == {"paper", "classic"}


def test_a_method_in_a_new_module_appears_in_the_comparison_of_a_tiny_run(plugin, tiny_comparison):
    assert plugin not in METHODS
    assert "throwaway_plugin" in methods.discover()
    assert method_info(plugin).summary == "Generalised-mean pooling, a linear embedding and the Proxy-Anchor loss."
    config = tiny_comparison(
        study="registry",
        methods=["ms"],
        classic_methods=[plugin],
        umap=False,
        tsne=False,
    )
    frame = tables.comparison_frame(compare.run_main(config), compare.run_classic(config), [], methods=config.methods)
    table = tables.comparison_table(frame)
    assert table["method"].tolist() == ["MS baseline", "Proxy-Anchor on GeM (test)"]
    assert table.loc[1, "group"] == "classic" and 0.0 <= table.loc[1, "R@1_mean"] <= 100.0
    assert "| Proxy-Anchor on GeM (test) (`throwaway_gem`) | Generalised-mean pooling" in rows_markdown(config.rows())


def test_a_reranked_row_is_registered_with_the_row_whose_runs_it_reranks():
    from dmlstudy.rows import BASELINE, RERANK, is_reranked, trained_row

    assert is_reranked(RERANK) and trained_row(RERANK) == BASELINE
    assert not is_reranked("crt") and trained_row("crt") == "crt"
    assert [name for name in main_rows() if is_reranked(name)] == [RERANK]
