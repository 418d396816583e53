"""Register a version in the Kubeflow Model Registry with the ``model-registry`` client; again is an update.

The registered model is found by name or created; the version (named after the
pipeline run) is found within it or created, and its properties are replaced by
the ones given; each artifact is found by name within the version and updated,
or created. So a retried step, or the step run again for the same run, changes
what is there and never adds a second version or artifact.

The client's async core (``ModelRegistryAPIClient``) is driven with
``asyncio.run``: its synchronous facade would patch the process's asyncio
globally (nest-asyncio) on construction.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit

from common.errors import UserError

AUTHOR = "llm-finetune-pipeline"


@dataclass(frozen=True)
class ArtifactSpec:
    """One place the version went, as a model artifact."""

    name: str
    uri: str
    model_format_name: str
    model_format_version: str
    storage_key: str | None = None  # the data connection (Secret) a deployment reads an s3:// URI with
    storage_path: str | None = None


@dataclass(frozen=True)
class Registration:
    """The registry's ids of what the step registered or updated."""

    url: str
    registered_model_id: str
    model_version_id: str
    artifact_ids: dict[str, str]  # artifact name -> id
    created: bool  # False: the version was there already and was updated


def register_version(
    url: str,
    token: str | None,
    model_name: str,
    version_name: str,
    properties: dict,
    artifacts: list[ArtifactSpec],
    custom_ca: str | None,
    token_hint: str,
) -> Registration:
    """Create or update ``model_name``'s version ``version_name`` with ``properties`` and ``artifacts``."""
    api = _client(url, token, custom_ca)
    return _run(url, _register(api, url, model_name, version_name, properties, artifacts), token_hint)


def add_version_properties(
    url: str, token: str | None, version_id: str, properties: dict, custom_ca: str | None, token_hint: str
) -> None:
    """Add ``properties`` to (or replace them in) the version ``version_id``, keeping its others."""
    api = _client(url, token, custom_ca)
    _run(url, _add_properties(api, version_id, properties), token_hint)


def _run(url: str, coroutine, token_hint: str):
    """Run a call on the registry's async client; its refusals and network failures as UserErrors."""
    from aiohttp import ClientError
    from mr_openapi.exceptions import ApiException, ForbiddenException, UnauthorizedException

    try:
        return asyncio.run(coroutine)
    except (UnauthorizedException, ForbiddenException) as error:
        raise UserError(
            f"The Model Registry at {url} refused the step ({error.status} {error.reason}): {token_hint}. Give the "
            "token's account access to the registry (OpenShift AI: Model registry settings → Manage permissions)."
        ) from None
    except ApiException as error:
        raise UserError(f"The Model Registry at {url} answered {error.status} {error.reason}: {error.body}") from None
    except (ClientError, OSError) as error:
        raise UserError(
            f"Could not reach the Model Registry at {url}: {error}. Check model_registry_url (the registry's REST "
            "service or route, with its port) and that this pod's network reaches it."
        ) from None


def _client(url: str, token: str | None, custom_ca: str | None):
    from model_registry.core import ModelRegistryAPIClient

    parts = urlsplit(url)
    address = f"{parts.scheme}://{parts.hostname}"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if parts.scheme == "https":
        if not token:
            raise UserError(
                f"No token to present to the Model Registry at {url}: an https registry (OpenShift AI's) takes a "
                "bearer token; set model_registry_secret to a Secret with the key 'token'."
            )
        return ModelRegistryAPIClient.secure_connection(address, port, user_token=token, custom_ca=custom_ca)
    return ModelRegistryAPIClient.insecure_connection(address, port, token)


async def _register(api, url, model_name, version_name, properties, artifacts) -> Registration:
    from model_registry.types import ModelArtifact, ModelVersion, RegisteredModel

    model = await api.get_registered_model_by_params(model_name)
    if model is None:
        model = await api.upsert_registered_model(
            RegisteredModel(name=model_name, owner=AUTHOR, description="Fine-tuned by llm-finetune-pipeline.")
        )
    version = await api.get_model_version_by_params(model.id, version_name)
    created = version is None
    if created:
        version = ModelVersion(name=version_name, author=AUTHOR, description=f"Pipeline run {version_name}.")
    version.custom_properties = properties
    version = await api.upsert_model_version(version, model.id)
    existing = {artifact.name: artifact for artifact in await api.get_model_version_artifacts(version.id)}
    ids = {}
    for spec in artifacts:
        fields = {key: value for key, value in vars(spec).items() if key != "name"}
        if isinstance(artifact := existing.get(spec.name), ModelArtifact):
            for key, value in fields.items():
                setattr(artifact, key, value)
            artifact = await api.upsert_model_artifact(artifact)
        else:
            artifact = await api.upsert_model_version_artifact(ModelArtifact(name=spec.name, **fields), version.id)
        ids[spec.name] = artifact.id
    return Registration(url, model.id, version.id, ids, created)


async def _add_properties(api, version_id: str, properties: dict) -> None:
    version = await api.get_model_version_by_id(version_id)
    if version is None:
        raise UserError(f"The Model Registry has no model version {version_id} (deleted since it was registered?).")
    version.custom_properties = {**(version.custom_properties or {}), **properties}
    await api.upsert_model_version(version)
