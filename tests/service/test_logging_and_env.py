"""Issue 12 item 5: trainguard's own loggers go through Powertools in every function, and the
environment variable names live in one place (settings), shared by the stack and the local mode."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from trainguard.rules import config as rules_config
from trainguard.rules import plugins
from trainguard.service import logs
from trainguard.service.settings import REQUIRED, Env, Settings
from trainguard.wiring import WIRING

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, logging, os, sys
sys.path.insert(0, {functions!r})
os.environ.update({env!r})
from trainguard.local.runtime import load_handler, LambdaContext
handler = load_handler(__import__("pathlib").Path({path!r}))
logging.getLogger("trainguard.engine.service").info("an engine INFO line")
from trainguard.service import logs
logger = logs.current_logger()
# what a handler decorated with inject_lambda_context does with its context
logger.append_keys(function_request_id="req-123")
logging.getLogger("trainguard.stop_job").warning("a service WARNING line")
"""


def run_in_lambda_process(fid: str, level: str = "INFO") -> list[dict]:
    """Import one function's handler in a fresh process that looks like Lambda."""
    env = {
        "AWS_LAMBDA_FUNCTION_NAME": f"trainguard-{fid}",
        Env.POWERTOOLS_LOG_LEVEL: level,
        Env.POWERTOOLS_SERVICE_NAME: WIRING.function(fid).service_name,
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    code = SCRIPT.format(
        functions=str(REPO / "functions"), env=env, path=str(REPO / "functions" / fid / "handler.py")
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_package_loggers_write_powertools_json_with_the_request_id_and_info_kept():
    lines = run_in_lambda_process("stop_job")
    by_message = {line["message"]: line for line in lines}
    info = by_message["an engine INFO line"]  # INFO is no longer dropped by Lambda's root logger
    assert info["level"] == "INFO" and info["service"] == "trainguard-stop-job"
    assert info["name"] == "trainguard.engine.service"
    warning = by_message["a service WARNING line"]
    assert warning["function_request_id"] == "req-123" and warning["service"] == "trainguard-stop-job"


def test_the_level_comes_from_powertools_log_level():
    lines = run_in_lambda_process("evaluate", level="WARNING")
    assert [line["message"] for line in lines] == ["a service WARNING line"]


def test_outside_a_function_package_records_propagate_as_usual(caplog):
    logs.function_logger("notify")
    logs.function_logger("clock")
    with caplog.at_level(logging.WARNING):
        logging.getLogger("trainguard.local").warning("runtime says hi")
    assert "runtime says hi" in caplog.text


def test_in_the_local_mode_each_record_goes_to_the_running_function():
    import io

    streams = {}
    for fid in ("notify", "clock"):
        handler = logs.function_logger(fid).registered_handler
        streams[fid] = handler.stream = io.StringIO()
    with logs.running("clock"):
        logging.getLogger("trainguard.engine.service").warning("tick trouble")
    assert streams["notify"].getvalue() == ""
    (line,) = [json.loads(x) for x in streams["clock"].getvalue().splitlines()]
    assert line["service"] == WIRING.function("clock").service_name and line["message"] == "tick trouble"


def test_every_function_logger_is_named_like_its_wiring_service():
    for fn in WIRING.functions:
        text = (REPO / "functions" / fn.id / "handler.py").read_text()
        assert f'function_logger("{fn.id}")' in text, fn.id
        assert "Logger(" not in text  # no second, unwired Powertools logger


# ----------------------------------------------------------------------------- one set of names


def test_settings_read_exactly_the_names_the_wiring_writes(monkeypatch):
    env = WIRING.environment(
        "stop_job", lambda v: f"<{v}>", log_level="INFO", features=frozenset({"sagemaker_stop"})
    )
    for key in list(env):
        monkeypatch.setenv(key, env[key])
    settings = Settings.from_env()
    assert (settings.table_name, settings.bus_name, settings.bucket_name) == (
        "<table:name>",
        "<bus:name>",
        "<bucket:name>",
    )
    assert settings.topic_arn == "<alert-topic:arn>" and settings.ingest_dlq_url == "<ingest-dlq:url>"
    assert settings.sagemaker_stop is True
    assert set(REQUIRED) <= set(env)
    assert env[Env.POWERTOOLS_LOG_LEVEL] == "INFO" and "LOG_LEVEL" not in env


def test_env_names_are_written_once():
    assert Env.RULE_MODULES == plugins.ENV_VAR
    assert Env.DEFAULT_RULES == rules_config.DEFAULT_RULES_ENV
    names = {v for k, v in vars(Env).items() if not k.startswith("_")}
    for path in [REPO / "infra" / "stack.py", REPO / "shared" / "trainguard" / "local" / "runtime.py"]:
        text = path.read_text()
        for name in names:
            assert f'"{name}"' not in text, f"{path.name} spells {name} itself; use settings.Env"
