"""Reads model ids back through OpenWebUI's own code (run by the OpenWebUI venv that
scripts/openwebui_db.sh builds, never by the project's): argv = the model ids; DATABASE_URL
names the database. Prints JSON: what OpenWebUI's models, access grants, model history and
config layers return, so a test compares the re-keyed rows with what OpenWebUI itself reads."""

import asyncio
import json
import sys

from open_webui.models.access_grants import AccessGrants
from open_webui.models.config import Config
from open_webui.models.model_history import ModelHistories
from open_webui.models.models import Models

CONFIG_KEYS = ("openai.api_configs", "ui.default_models", "ui.model_order_list", "task.model.default")


async def read(ids):
    models = {}
    for model_id in ids:
        model = await Models.get_model_by_id(model_id)
        grants = await AccessGrants.get_grants_by_resource("model", model_id)
        history = await ModelHistories.get_history_by_model_id(model_id)
        models[model_id] = {
            "found": model is not None,
            "description": model.meta.description if model else None,
            "base_model_id": model.base_model_id if model else None,
            "version_in_history": bool(model) and model.version_id in [entry.id for entry in history],
            "grants": sorted([grant.principal_type, grant.principal_id, grant.permission] for grant in grants),
        }
    config = {key: await Config.get(key) for key in CONFIG_KEYS}
    return {"models": models, "config": config}


print(json.dumps(asyncio.run(read(sys.argv[1:]))))
