"""values.schema.json accepts the shipped values and rejects broken ones
(through helm itself); Ivy's templates ConfigMap and API key wiring."""

from __future__ import annotations

import json
import sys

import jsonschema
import pytest
import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

from tests.deploy.tools import CHART, GPU_PROFILE, KUBE_VERSION, container, env, helm, one, render, values_file

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def merged(base: dict, override: dict) -> dict:
    """Helm's merge of a values file over the chart's defaults."""
    out = dict(base)
    for k, v in override.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def defaults() -> dict:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def test_schema_is_valid_and_accepts_the_shipped_values():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    validator = jsonschema.Draft7Validator(SCHEMA)
    assert not list(validator.iter_errors(defaults()))
    assert not list(validator.iter_errors(merged(defaults(), yaml.safe_load(GPU_PROFILE.read_text()))))


BROKEN = {
    "misspelt key": ({"tulip": {"replica": 3}}, "additional properties 'replica' not allowed"),
    "negative replicas": ({"tulip": {"replicas": -1}}, "/tulip/replicas"),
    "port out of range": ({"ivy": {"port": 70000}}, "/ivy/port"),
    "gpu count zero": ({"tulip": {"gpu": {"enabled": True, "count": 0}}}, "/tulip/gpu/count"),
    "unknown dtype": ({"tulip": {"engine": {"dtype": "fp8"}}}, "/tulip/engine/dtype"),
    "malformed capture list": ({"tulip": {"engine": {"capture": "128 tokens"}}}, "/tulip/engine/capture"),
    "pvc without a claim": ({"model": {"source": "pvc", "path": "e5"}}, "/model/pvc/claimName"),
    "volume without a model path": ({"model": {"source": "hostPath", "hostPath": {"path": "/srv/models"}}},
                                    "/model/path"),
    "emptyDir without the init hook": ({"model": {"source": "emptyDir", "path": "e5"}}, "/model/init/enabled"),
    "unknown model source": ({"model": {"source": "s3"}}, "/model/source"),
    "root user": ({"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
    "writable root filesystem": ({"containerSecurityContext": {"readOnlyRootFilesystem": False}},
                                 "/containerSecurityContext/readOnlyRootFilesystem"),
    "added capability": ({"containerSecurityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]}}},
                         "/containerSecurityContext/capabilities/add"),
    "drain timeout as text": ({"tulip": {"drainTimeoutSeconds": "30s"}}, "/tulip/drainTimeoutSeconds"),
    "bad memory quantity": ({"tulip": {"resources": {"limits": {"memory": "lots"}}}},
                            "/tulip/resources/limits/memory"),
    "prompt prefix not a string": ({"ivy": {"config": {"prompts": {"query": 1}}}}, "/ivy/config/prompts/query"),
    "co-located Ivy switch as text": ({"tulip": {"colocatedIvy": {"enabled": "yes"}}}, "/tulip/colocatedIvy/enabled"),
    "co-located Ivy misspelt key": ({"tulip": {"colocatedIvy": {"enable": True}}},
                                    "additional properties 'enable' not allowed"),
    "co-located Ivy service type": ({"tulip": {"colocatedIvy": {"service": {"type": "Headless"}}}},
                                    "/tulip/colocatedIvy/service/type"),
    "co-located Ivy bad cpu quantity": ({"tulip": {"colocatedIvy": {"resources": {"requests": {"cpu": "two"}}}}},
                                        "/tulip/colocatedIvy/resources/requests/cpu"),
    "adapter path not absolute": ({"tulip": {"lora": [{"name": "legal", "path": "adapters/legal"}]}},
                                  "/tulip/lora/0/path"),
    "adapter without a name": ({"tulip": {"lora": [{"path": "/adapters/legal"}]}}, "/tulip/lora/0"),
    "negative maxAdapters": ({"tulip": {"maxAdapters": -1}}, "/tulip/maxAdapters"),
    "co-located Ivy env not a list": ({"tulip": {"colocatedIvy": {"extraEnv": {"IVY_IO_THREADS": "1"}}}},
                                      "/tulip/colocatedIvy/extraEnv"),
}


@pytest.mark.parametrize("values, where", BROKEN.values(), ids=BROKEN.keys())
def test_schema_rejects_broken_values(helm_bin, tmp_path, values, where):
    path = values_file(tmp_path, values)
    out = helm("template", "embed", CHART, "--kube-version", KUBE_VERSION, "-f", path)
    assert out.returncode != 0, f"helm accepted {values}"
    assert "values don't meet the specifications of the schema" in out.stderr
    assert where in out.stderr, out.stderr
    lint = helm("lint", CHART, "--kube-version", KUBE_VERSION, "-f", path)
    assert lint.returncode != 0


def test_templates_change_restarts_neither_ivy_nor_tulip(helm_bin, tmp_path):
    before = render()
    prompts = {"ivy": {"config": {"defaultPromptName": "query",
                                  "prompts": {"query": "query: ", "document": 'passage "quoted" \\ '}}}}
    after = render(values_file(tmp_path, prompts))
    config = one(after, "ConfigMap", "ivy")
    assert config != one(before, "ConfigMap", "ivy")
    # The pod templates are byte-for-byte the same: no rollout of either.
    for component in ("ivy", "tulip"):
        assert one(after, "Deployment", component) == one(before, "Deployment", component)
    # What Ivy reads is the TOML it documents, with the values verbatim.
    parsed = tomllib.loads(config["data"]["templates.toml"])
    assert parsed == {"default_prompt_name": "query",
                      "prompts": {"query": "query: ", "document": 'passage "quoted" \\ '}}
    # Mounted as a directory (subPath mounts never see updates).
    ivy = one(after, "Deployment", "ivy")
    c = container(ivy, "ivy")
    mount = next(m for m in c["volumeMounts"] if m["name"] == "config")
    assert "subPath" not in mount
    assert env(c)["IVY_CONFIG"].startswith(mount["mountPath"] + "/")
    volume = next(v for v in ivy["spec"]["template"]["spec"]["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == config["metadata"]["name"]


def test_default_templates_are_valid_toml(default_objects):
    parsed = tomllib.loads(one(default_objects, "ConfigMap", "ivy")["data"]["templates.toml"])
    assert parsed == {"prompts": {}}


def test_api_key_comes_from_an_existing_secret(gpu_objects):
    ref = env(container(one(gpu_objects, "Deployment", "ivy"), "ivy"))["IVY_API_KEY"]
    assert ref == {"secretKeyRef": {"name": "ivy-api-key", "key": "api-key"}}
    assert not [o for o in gpu_objects if o["kind"] == "Secret"]


def test_api_key_value_creates_a_secret(helm_bin):
    objects = render(sets={"ivy.apiKey.value": "s3cret"})
    secret = one(objects, "Secret", "ivy")
    ref = env(container(one(objects, "Deployment", "ivy"), "ivy"))["IVY_API_KEY"]
    assert ref == {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "api-key"}}
    assert secret["data"]["api-key"] == "czNjcmV0"  # base64("s3cret")


def test_no_api_key_by_default(default_objects):
    assert "IVY_API_KEY" not in env(container(one(default_objects, "Deployment", "ivy"), "ivy"))


def test_api_key_value_and_existing_secret_are_exclusive(helm_bin):
    out = helm("template", "embed", CHART, "--kube-version", KUBE_VERSION,
               "--set", "ivy.apiKey.value=x", "--set", "ivy.apiKey.existingSecret=y")
    assert out.returncode != 0
    assert "set either existingSecret or value, not both" in out.stderr
