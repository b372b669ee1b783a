"""Application arguments: one section per part, each the part's own config type with its defaults written once;
validation messages at every level; the model override; a custom template from the YAML reaching the engine.
How the placement becomes Ray options is tests/test_placement.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from deployments.batching_config import BatchingConfig
from deployments.config import (
    MODEL_ENV,
    AppArgs,
    AuthSettings,
    AutoscalingSettings,
    DeploymentSettings,
    EngineDeployment,
    IngressDeployment,
    LimitSettings,
    PlacementSettings,
    RouterSettings,
    StrictSettings,
)
from deployments.hash_ring import DEFAULT_LOAD_FACTOR
from radix_core.engine_config import DEFAULT_RADIX_THRESHOLD, EngineConfig
from radix_core.tasks import TaskConfig
from radix_core.tasks.config import DEFAULT_MAX_ITEMS
from radix_core.templates import RerankTemplate

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = (AppArgs, LimitSettings, AuthSettings, RouterSettings, AutoscalingSettings, DeploymentSettings,
            EngineDeployment, IngressDeployment, PlacementSettings)
TEMPLATE = {"prefix": "<|im_start|>system\nJudge the Document.<|im_end|>\n<|im_start|>user\n",
            "body": "<Query>: {query}\n<Document>: {document}", "suffix": "<|im_end|>\n<|im_start|>assistant\n"}


@pytest.fixture(autouse=True)
def no_model_env(monkeypatch):
    monkeypatch.delenv(MODEL_ENV, raising=False)


def leaves(data: dict, prefix: str = "") -> dict[str, object]:
    """{dotted path: value} of every non-dict value (and empty dict) in `data`."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# --- one shape, each default once -----------------------------------------------------------------------------------

def test_library_sections_are_the_library_config_types_with_their_defaults():
    args = AppArgs(model="m")
    assert (args.engine, args.tasks, args.batching) == (EngineConfig(), TaskConfig(), BatchingConfig())
    assert args.engine.radix_threshold == DEFAULT_RADIX_THRESHOLD and args.tasks.max_items == DEFAULT_MAX_ITEMS
    assert args.router.load_factor == DEFAULT_LOAD_FACTOR


def test_every_setting_of_the_app_models_is_described():
    for model in SETTINGS:
        assert all(f.description for f in model.model_fields.values()), model.__name__
    assert all(issubclass(model, StrictSettings) for model in SETTINGS)


def test_a_field_of_a_library_config_is_a_setting_with_no_edit_here():
    """Every field the dataclasses declare (a new TaskConfig field included) is accepted under its section, with the
    dataclass's own default, and reaches the object."""
    for section, config_type in (("engine", EngineConfig), ("tasks", TaskConfig), ("batching", BatchingConfig)):
        defaults = config_type()
        for field in dataclasses.fields(config_type):
            value = getattr(defaults, field.name)
            args = AppArgs.model_validate({"model": "m", section: {field.name: value}})
            assert getattr(getattr(args, section), field.name) == value, f"{section}.{field.name}"


@pytest.mark.parametrize("path", ["serve_config.yaml", "k8s/rayservice.yaml"])
def test_the_yaml_configs_repeat_no_default(path):
    """A YAML sets only what differs from the defaults (which are written once, in the section types)."""
    config = yaml.safe_load((ROOT / path).read_text())
    if "spec" in config:
        config = yaml.safe_load(config["spec"]["serveConfigV2"])
    given = config["applications"][0]["args"]
    defaults = leaves(AppArgs(model="m").model_dump(mode="json"))
    repeated = {key: value for key, value in leaves(given).items() if key in defaults and defaults[key] == value}
    assert repeated == {}, f"{path} repeats defaults: {repeated}"
    AppArgs.model_validate({"model": "m", **given})


# --- the model ------------------------------------------------------------------------------------------------------

def test_env_var_overrides_model(monkeypatch):
    monkeypatch.setenv(MODEL_ENV, "/models/tiny")
    assert AppArgs().model == "/models/tiny"
    assert AppArgs.model_validate({"model": "Qwen/Qwen3-Reranker-4B"}).model == "/models/tiny"
    monkeypatch.setenv(MODEL_ENV, "")
    assert AppArgs.model_validate({"model": "Qwen/Qwen3-Reranker-4B"}).model == "Qwen/Qwen3-Reranker-4B"


def test_a_missing_model_names_both_places_to_set_it():
    with pytest.raises(ValidationError, match=f"no model: set args.model in the config .* or the environment "
                                              f"variable {MODEL_ENV}"):
        AppArgs.model_validate({"batching": {"max_batch_tokens": 4096}})


# --- unknown keys, at every level -----------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    ({"max_batch_token": 4096}, r"unknown setting\(s\) 'max_batch_token' \(did you mean 'batching.max_batch_tokens'"
                                r"\?\) for AppArgs; known: model, "),
    ({"modle": "x"}, r"'modle' \(did you mean 'model'\?\) for AppArgs"),
    ({"max_request_tokens": 100}, r"'max_request_tokens' \(it belongs in 'limits.max_request_tokens'\) for AppArgs"),
    ({"max_ongoing_requests": 1}, r"it belongs in 'placement.engine.max_ongoing_requests' or "
                                  r"'placement.ingress.max_ongoing_requests'"),
    ({"max_replicas": 2}, r"it belongs in 'placement.engine.autoscaling.max_replicas' or "
                          r"'placement.ingress.autoscaling.max_replicas'"),
    ({"placement": {"cpus": 1}}, r"'cpus' \(it belongs in 'engine.cpus' or 'ingress.cpus'\) for PlacementSettings"),
    ({"engine": {"radx": "full"}}, r"'radx' \(did you mean 'radix'\?\) for EngineConfig; known: device, dtype"),
    ({"tasks": {"max_itemz": 8}}, r"'max_itemz' \(did you mean 'max_items'\?\) for TaskConfig"),
    ({"batching": {"max_batch_token": 8}}, r"'max_batch_token' \(did you mean 'max_batch_tokens'\?\) for "
                                           r"BatchingConfig"),
    ({"limits": {"max_request_byte": 8}}, r"'max_request_byte' \(did you mean 'max_request_bytes'\?\) for "
                                          r"LimitSettings"),
    ({"auth": {"api_key_file": "f"}}, r"'api_key_file' \(did you mean 'api_keys_file'\?\) for AuthSettings"),
    ({"router": {"load_factr": 2.0}}, r"'load_factr' \(did you mean 'load_factor'\?\) for RouterSettings"),
    ({"placement": {"acelerator": "gpu"}}, r"'acelerator' \(did you mean 'accelerator'\?\) for PlacementSettings"),
    ({"placement": {"engine": {"cpu": 1}}}, r"'cpu' \(did you mean 'cpus'\?\) for EngineDeployment"),
    ({"placement": {"ingress": {"zzz": 1}}}, r"'zzz' for IngressDeployment; known: num_replicas"),
    ({"placement": {"engine": {"autoscaling": {"max_replica": 2}}}}, r"'max_replica' \(did you mean "
                                                                      r"'max_replicas'\?\) for AutoscalingSettings"),
])
def test_unknown_keys_are_named_with_a_suggestion_at_every_level(args, message):
    with pytest.raises(ValidationError, match=message):
        AppArgs.model_validate({"model": "m", **args})


# --- values ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    ({"engine": {"dtype": "float64"}}, "unknown dtype 'float64': choose one of auto, float32"),
    ({"engine": {"radix": "on"}}, "unknown radix 'on': choose one of auto, off, mlp, full"),
    ({"engine": {"attention": "xformers"}}, "unknown attention 'xformers'"),
    ({"engine": {"radix_threshold": 1.5}}, "radix_threshold is a compression N'/N between 0 and 1"),
    ({"engine": {"radix_threshold": "high"}}, r"engine.radix_threshold\n.*valid number"),
    ({"engine": {"device": "cuda:1"}}, "engine.device must be auto .* or cpu, got 'cuda:1'"),
    ({"engine": {"batch_invariant": True, "attention": "flash"}},
     "batch_invariant runs its own attention .* not attention='flash'"),
    ({"engine": {"batch_invariant": "sometimes"}}, r"engine.batch_invariant\n.*valid boolean"),
    ({"tasks": {"max_items": 0}}, "max_items must be at least 1"),
    ({"tasks": {"templates": {"rerank": {"prefix": "p", "body": "no field", "suffix": "s"}}}},
     r"the rerank body must contain \{document\} exactly once"),
    ({"tasks": {"templates": {"classify": {}}}}, "templates can be configured for rerank, embed"),
    ({"batching": {"max_batch_tokens": 0}}, "max_batch_tokens must be at least 1"),
    ({"batching": {"batch_wait_timeout_s": -1}}, "batch_wait_timeout_s must be between 0 and 10 s"),
    ({"batching": {"index_builder": "sometimes"}}, "unknown index_builder 'sometimes': choose one of actor, inline"),
    ({"batching": {"max_queue_wait_s": 0}}, "max_queue_wait_s must be above 0 s"),
    ({"placement": {"accelerator": "tpu"}}, "placement.accelerator"),
    ({"router": {"load_factor": 0.9}}, "greater than or equal to 1"),
    ({"limits": {"max_request_tokens": 20000}, "batching": {"max_batch_tokens": 16384}},
     r"limits.max_request_tokens \(20000\) must be <= batching.max_batch_tokens \(16384\)"),
    ({"tasks": {"max_tokens": 9000}, "limits": {"max_request_tokens": 8192}},
     r"tasks.max_tokens \(9000\) must be <= limits.max_request_tokens .*an item cannot be split across parts"),
    ({"auth": {"api_keys_env": "sk-live-1234"}}, "must name an environment variable"),
    ({"placement": {"engine": {"num_replicas": 2, "autoscaling": {}}}},
     "set num_replicas .a fixed count. or autoscaling .min/max bounds., not both"),
    ({"placement": {"engine": {"autoscaling": {"min_replicas": 3, "max_replicas": 2}}}},
     r"min_replicas \(3\) must be <= max_replicas \(2\)"),
])
def test_invalid_values_say_what_is_wrong(args, message):
    with pytest.raises(ValidationError, match=message):
        AppArgs.model_validate({"model": "m", **args})


def test_api_keys_env_error_does_not_echo_the_value():
    with pytest.raises(ValidationError) as err:
        AppArgs.model_validate({"model": "m", "auth": {"api_keys_env": "sk-live-1234"}})
    assert "sk-live-1234" not in str(err.value)


def test_library_configs_are_the_objects_themselves():
    """A section takes its config object as well as a dict of its fields (Python callers, tests)."""
    engine = EngineConfig(radix="full")
    assert AppArgs(model="m", engine=engine).engine is engine


def test_batch_invariant_from_the_yaml_reaches_the_replicas_engine_config():
    from deployments.placement import ClusterShape, engine_config

    args = AppArgs.model_validate({"model": "m", "engine": {"batch_invariant": True}})
    assert engine_config(args, ClusterShape()).batch_invariant is True
    assert EngineConfig().batch_invariant is False


# --- a custom template, from the YAML to the engine -----------------------------------------------------------------

def test_a_template_from_the_yaml_reaches_the_engine(tmp_path, tiny_model_dir):
    from deployments.launcher import load_config
    from deployments.placement import ClusterShape, engine_config
    from radix_core import Engine

    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["applications"][0]["args"].update(model=str(tiny_model_dir("qwen3", "causal_lm")),
                                             tasks={"templates": {"rerank": TEMPLATE}})
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    (app,) = load_config(str(tmp_path / "c.yaml"))["applications"]
    args = app["args"]
    assert args.tasks.templates == {"rerank": RerankTemplate(**TEMPLATE)}

    engine = Engine.from_pretrained(args.model, engine_config(args, ClusterShape()), tasks=args.tasks)
    default = Engine.from_pretrained(args.model, device="cpu")
    assert engine.context.template("rerank") == RerankTemplate(**TEMPLATE) != default.context.template("rerank")
    custom, plain = (e.rerank("what is a trie", ["A trie is a prefix tree."]) for e in (engine, default))
    assert custom.usage.input_tokens != plain.usage.input_tokens  # the prompt the engine scored is the YAML's


def test_every_app_model_is_strict():
    """No pydantic model reachable from AppArgs lets an unknown key through."""
    def models(model: type[BaseModel]):
        yield model
        for field in model.model_fields.values():
            for kind in (field.annotation, *getattr(field.annotation, "__args__", ())):
                if isinstance(kind, type) and issubclass(kind, BaseModel):
                    yield from models(kind)

    assert {m.__name__ for m in models(AppArgs)} == {m.__name__ for m in SETTINGS} - {"DeploymentSettings"}
    assert all(m.model_config.get("extra") == "forbid" for m in models(AppArgs))


# --- the README's configuration section -----------------------------------------------------------------------------

def readme_configuration() -> str:
    text = (ROOT / "README.md").read_text()
    return text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]


def test_readme_lists_every_setting_of_every_section():
    rows = {row.split("|")[1].strip(" `"): row.split("|")[3] for row in readme_configuration().splitlines()
            if row.startswith("| ") and not row.startswith("| section")}
    sections = {name: field.annotation for name, field in AppArgs.model_fields.items()
                if isinstance(field.annotation, type) and (dataclasses.is_dataclass(field.annotation)
                                                           or issubclass(field.annotation, BaseModel))}
    top = [name for name in AppArgs.model_fields if name not in sections]
    nested = {"placement": [*PlacementSettings.model_fields, *EngineDeployment.model_fields]}
    expected = {"(top level)": top, **{name: nested.get(name, _fields(kind)) for name, kind in sections.items()}}
    assert set(rows) == set(expected)
    for section, names in expected.items():
        missing = [name for name in names if f"`{name}`" not in rows[section]]
        assert not missing, f"README's Configuration table leaves out {section}: {missing}"


def _fields(kind: type) -> list[str]:
    return [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else list(kind.model_fields)


def test_readme_template_example_is_a_valid_config():
    example = readme_configuration().split("```yaml\n", 1)[1].split("```", 1)[0]
    args = AppArgs.model_validate(yaml.safe_load(example)["args"])
    assert isinstance(args.tasks.templates["rerank"], RerankTemplate)
