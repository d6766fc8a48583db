"""An OpenAI-compatible server over the engine core: ``python -m models.server --model-dir DIR``.

Its modules: ``cli`` (the command), ``app`` (the HTTP front end's routes), ``responses`` (a request's choices as
server-sent events or one response), ``client`` (the front end's side of the engine core), ``engine_core`` (the engine
process), ``protocol`` (request bodies, the error object), ``text`` (a choice's streamed text), ``tokenizer_queue``
(text prompts to ids off the loop), ``metrics`` (Prometheus), ``heap`` (the collector: frozen heap, its time). Only
the command is imported here (it imports nothing heavy): the engine process, spawned, imports this package and then
only what it runs."""

from models.server.cli import main, parser

__all__ = ["main", "parser"]
