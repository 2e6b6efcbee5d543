"""``specdeploy-server``: start the OpenAI-compatible speculative decoding server.

Two launch shapes:

* the seed's:      ``specdeploy-server <target> [<draft>] --port N --debug``
* the operator's:  ``specdeploy-server --config /etc/specdeploy/server.yaml``

Flags override the file. ``--print-config`` prints the effective configuration (file form) and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Generator
from pathlib import Path
from types import FrameType
from typing import Any

from pydantic import ValidationError

from specdeploy_server import __version__
from specdeploy_server.config import Method, ServerConfig, merge, read_config_file

log = logging.getLogger("specdeploy_server")

_EXIT_SIGNALS = (signal.SIGINT, signal.SIGTERM)
HTTP_BACKSTOP_SECONDS = 2
"""After SIGTERM the process exits right after its last in-flight request ends, which is at most
shutdownTimeoutSeconds later; only a connection that will not close (a client that stopped reading) holds it
until ``ceil(shutdownTimeoutSeconds) + HTTP_BACKSTOP_SECONDS``. Releasing the models comes on top."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specdeploy-server",
        description="OpenAI-compatible server with speculative decoding (draft + target executors). "
        "Configuration comes from --config (JSON/YAML, camelCase keys; schema in docs/server.md) "
        "and these flags, which win over the file.",
    )
    p.add_argument("target", nargs="?", help="target model directory (HF checkpoint or TensorRT-LLM engine)")
    p.add_argument("draft", nargs="?", help="draft model directory (optional)")
    p.add_argument("--config", type=Path, help="server configuration file (.json, .yaml)")
    p.add_argument("--print-config", action="store_true", help="print the effective configuration and exit")
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    g = p.add_argument_group("model")
    g.add_argument("--served-model-name", help="name in /v1/models (default: target directory name)")
    g.add_argument(
        "--served-model-alias",
        action="append",
        metavar="NAME",
        help="another name a request may send (repeatable)",
    )
    g.add_argument("--tokenizer", help="tokenizer directory (default: the target directory)")
    g.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16", "float64"])
    g.add_argument("--max-model-len", type=int, help="context length limit")
    g.add_argument(
        "--backend",
        choices=["auto", "pytorch-reference", "trtllm-engine", "trtllm-llmapi"],
        help="model backend",
    )
    g = p.add_argument_group("speculative decoding")
    # the methods beside draftTarget, promptLookup and none run on backend trtllm-llmapi only
    g.add_argument("--speculative-method", choices=[method.value for method in Method])
    g.add_argument("--draft-len", help="draft tokens per step, or 'auto'")
    g.add_argument("--max-draft-len", type=int)
    g.add_argument("--acceptance", choices=["tokenMatch", "logits"])
    g.add_argument("--use-logits", action="store_true", help="same as --acceptance logits")
    g.add_argument("--max-matching-ngram-size", type=int, help="prompt lookup: longest n-gram to match")
    g = p.add_argument_group("placement")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"])
    g.add_argument("--target-device-ids", help="comma-separated GPU ids of the target, e.g. 0,1")
    g.add_argument("--draft-device-ids", help="comma-separated GPU ids of the draft")
    g.add_argument("--cpu-threads", type=int)
    g = p.add_argument_group("runtime")
    g.add_argument("--max-batch-size", type=int)
    g.add_argument(
        "--max-queue-size", type=int, help="requests waiting beyond the batch before 503; 0 (default): no cap"
    )
    g.add_argument("--kv-cache-free-gpu-mem-fraction", type=float)
    g = p.add_argument_group("serving")
    g.add_argument("--host")
    g.add_argument("--port", type=int)
    g.add_argument("--api-key-file", help="file holding the API key")
    g.add_argument("--api-key-env", help="environment variable holding the API key")
    g.add_argument("--chat-template", help="Jinja chat template file")
    g.add_argument("--shutdown-timeout", type=float, help="seconds in-flight requests get on shutdown")
    g.add_argument("--max-request-body-bytes", type=int, help="larger request bodies get 413")
    g.add_argument(
        "--unknown-fields",
        choices=["warn", "refuse"],
        help="request fields the server does not implement: accept and log them (warn), or 400 (refuse)",
    )
    g = p.add_argument_group("logging")
    g.add_argument("--debug", action="store_true", help="debug logging (per-step acceptance)")
    g.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    g.add_argument("--log-format", choices=["text", "json"])
    return p


def _ids(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def overrides_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """CLI flags -> a partial configuration in file form (camelCase), set keys only."""
    out: dict[str, Any] = {}

    def put(path: str, value: Any) -> None:
        if value is None:
            return
        node = out
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    put("model.target", args.target)
    put("model.draft", args.draft)
    put("model.servedModelName", args.served_model_name)
    put("model.servedModelAliases", args.served_model_alias)
    put("model.tokenizer", args.tokenizer)
    put("model.dtype", args.dtype)
    put("model.maxModelLen", args.max_model_len)
    put("backend", args.backend)
    put("speculative.method", args.speculative_method)
    if args.draft_len is not None:
        put("speculative.draftLen", args.draft_len if args.draft_len == "auto" else int(args.draft_len))
    put("speculative.maxDraftLen", args.max_draft_len)
    put("speculative.acceptance", "logits" if args.use_logits else args.acceptance)
    put("speculative.promptLookup.maxMatchingNgramSize", args.max_matching_ngram_size)
    put("placement.device", args.device)
    put("placement.targetDeviceIds", _ids(args.target_device_ids) if args.target_device_ids else None)
    put("placement.draftDeviceIds", _ids(args.draft_device_ids) if args.draft_device_ids else None)
    put("placement.cpuThreads", args.cpu_threads)
    put("runtime.maxBatchSize", args.max_batch_size)
    put("runtime.maxQueueSize", args.max_queue_size)
    put("runtime.kvCacheFreeGpuMemFraction", args.kv_cache_free_gpu_mem_fraction)
    put("serving.host", args.host)
    put("serving.port", args.port)
    put("serving.apiKeyFile", args.api_key_file)
    put("serving.apiKeyEnv", args.api_key_env)
    put("serving.chatTemplate", args.chat_template)
    put("serving.shutdownTimeoutSeconds", args.shutdown_timeout)
    put("serving.maxRequestBodyBytes", args.max_request_body_bytes)
    put("serving.unknownFields", args.unknown_fields)
    put("logging.level", "DEBUG" if args.debug else args.log_level)
    put("logging.format", args.log_format)
    return out


def load_config(argv: list[str] | None = None) -> ServerConfig:
    args = build_parser().parse_args(argv)
    base = read_config_file(args.config) if args.config else {}
    return ServerConfig.model_validate(merge(base, overrides_from_args(args)))


def read_api_key(config: ServerConfig) -> str | None:
    serving = config.serving
    if serving.api_key_file is not None:
        return serving.api_key_file.read_text(encoding="utf-8").strip() or None
    if serving.api_key_env is not None:
        value = os.environ.get(serving.api_key_env)
        if not value:
            raise SystemExit(f"serving.apiKeyEnv: environment variable {serving.api_key_env} is not set")
        return value
    return None


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": record.created,
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        payload.update(getattr(record, "fields", {}))
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload)


def _without_probes(record: logging.LogRecord) -> bool:
    """uvicorn's access-log records carry (client, method, path, http version, status) as args."""
    args = record.args if isinstance(record.args, tuple) else ()
    return not (len(args) > 2 and str(args[2]).startswith(_PROBE_PATHS))


_PROBE_PATHS = ("/health",)


def setup_logging(config: ServerConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.logging.format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.logging.level)


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = load_config(argv)
    except (ValidationError, ValueError, OSError) as exc:
        parser.exit(2, f"specdeploy-server: invalid configuration:\n{exc}\n")
    if args.print_config:
        print(json.dumps(config.dump(), indent=2))
        return
    setup_logging(config)
    serve(config)


def serve(config: ServerConfig) -> None:
    import uvicorn  # noqa: PLC0415 (keeps --help and --print-config fast)

    from specdeploy_server.api.app import app_state, create_app  # noqa: PLC0415
    from specdeploy_server.backends.factory import build_engine  # noqa: PLC0415

    engine = build_engine(config)
    app = create_app(
        engine,
        served_model_name=config.model.name,
        served_model_aliases=config.model.served_model_aliases,
        api_key=read_api_key(config),
        default_max_tokens=config.serving.default_max_tokens,
        shutdown_timeout=config.serving.shutdown_timeout_seconds,
        max_request_body_bytes=config.serving.max_request_body_bytes,
        unknown_fields=config.serving.unknown_fields,
    )
    state = app_state(app)
    state.metrics.set_config(config.dump())
    shutdown_timeout = config.serving.shutdown_timeout_seconds

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Readiness goes false at once, so the Service stops routing here, and the engine's grace period
            # starts now: in-flight requests get shutdownTimeoutSeconds from the signal, then are aborted.
            state.begin_drain()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None, None, None]:
            # uvicorn's own re-raises the signal after shutting down, so the process would die of SIGTERM
            # (status 143) even after a clean drain; a drained server exits normally (status 0).
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in _EXIT_SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    uvicorn_config = uvicorn.Config(
        app,
        host=config.serving.host,
        port=config.serving.port,
        log_level=config.logging.level.lower(),
        access_log=config.logging.access_log,
        # A backstop only: the engine ends every request by shutdown_timeout, which ends its response;
        # uvicorn cuts connections still open this much later (a client that stopped reading).
        timeout_graceful_shutdown=math.ceil(shutdown_timeout) + HTTP_BACKSTOP_SECONDS,
    )
    # uvicorn set up its loggers just now: the access log leaves out the kubelet's probes (a line every few
    # seconds per pod would bury the requests).
    logging.getLogger("uvicorn.access").addFilter(_without_probes)
    server = _Server(uvicorn_config)
    freeze_startup_heap()
    log.info("serving %s on %s:%d", config.model.name, config.serving.host, config.serving.port)
    server.run()


#: allocations (net of deallocations) between collections of the youngest generation, once serving
GC_GEN0_THRESHOLD = 20_000


def freeze_startup_heap() -> None:
    """Move everything alive once the models are loaded (torch, transformers, the models' Python objects,
    which live as long as the process: about 440 000 objects on the reference backend with the campaign's
    tiny models) out of the garbage collector's reach, so that its full collections, which a burst of
    requests triggers, stop walking them. A full collection over them took 270 ms on the shared 2-core
    machine, with the event loop stopped: refusals during the campaign's 1 000-request flood took that much
    longer. What is frozen is never freed by the collector; it was never going to be.

    And the youngest generation is collected after ``GC_GEN0_THRESHOLD`` allocations instead of Python's
    700: a request allocates hundreds of objects and a streamed token dozens, nearly all freed by reference
    counting, so the default collected the young generation every few requests (a burst of short requests
    spent about a tenth of the server's CPU time in the collector); the cycles it finds wait a little
    longer, a few MB."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)
