"""An OpenAI-compatible server over the engine core: ``python -m models.server --model-dir DIR``."""

from models.server.app import ServerState, build_app
from models.server.cli import main, parser
from models.server.client import EngineClient, EngineFailed, RequestStream
from models.server.engine_core import EngineSpec, ServedModel

__all__ = ["EngineClient", "EngineFailed", "EngineSpec", "RequestStream", "ServedModel", "ServerState", "build_app",
           "main", "parser"]
