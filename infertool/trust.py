"""What infertool trusts a recipe or a file with: where an API key may go, and whether remote code runs.

A recipe is often written by someone else, so two rules hold for everything that reads one:

- **An API key goes only where the user sent it.** The value of the variable named by ``serve.api_key_env``
  is sent to a server only when (a) infertool itself launched that server and talks to it on this machine
  (a loopback or wildcard host, or an address of this host), or (b) the user gave that URL outside any file:
  on the command line (``--url``, ``--set eval.url=...``) or in the environment variable
  ``INFERTOOL_KEY_URLS`` (comma-separated URLs; scheme, host and port must match). A URL that comes from a
  recipe or a pid file alone never gets the key: the request goes without it (a server that wants one then
  answers 401, reported as such) and a warning says once which variable was kept from which URL and how to
  allow it. ``key_for`` is the one place this is decided.
- **Remote code runs only when the recipe says ``model.trust_remote_code: true``**; then every engine that
  loads the model gets it, and ``announce_remote_code`` says so once on the screen. The same holds for the code
  of an lm-eval task folder (``!function``, ``class:``, includes and data outside it, a template Jinja's
  sandbox refuses): only with ``eval.lm_eval.trust_code: true`` (infertool.evaluate.lm_eval_tasks), said by
  ``announce_task_code``; without it lm-eval's templates are rendered in that sandbox (lm_eval_sandbox.py).
"""

from __future__ import annotations

import ipaddress
import os
from urllib.parse import urlsplit

KEY_URLS_VAR = "INFERTOOL_KEY_URLS"
_LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}
_WILDCARDS = {"", "0.0.0.0", "::", "[::]"}

_warned: set[tuple[str, str]] = set()
_announced: set[str] = set()


def origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, with the default port filled in; None when it is not one."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80)


def same_origin(a: str, b: str) -> bool:
    oa = origin(a)
    return oa is not None and oa == origin(b)


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_this_machine(host: str) -> bool:
    """A loopback host, or a literal IP address that this machine can listen on (checked by binding to it).
    Host names other than localhost are not resolved: what they name can change between two lookups."""
    host = host.strip("[]")
    if is_loopback(host):
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    from infertool.procs import port_free

    try:
        port_free(host, 0)
    except OSError:
        return False
    return True


def allowed_by_env(url: str, environ=None) -> bool:
    environ = os.environ if environ is None else environ
    listed = [u.strip() for u in (environ.get(KEY_URLS_VAR) or "").split(",") if u.strip()]
    return any(same_origin(url, u) for u in listed)


def key_for(url: str, key_env: str | None, *, user_urls=(), launched: bool = False,
            value: str | None = None, environ=None, why: str | None = None, flag: str | None = "--url",
            warn=None) -> str | None:
    """The API key to send to ``url``, or None.

    ``key_env``: the variable that holds the key (serve.api_key_env); ``value``: the key when the caller has
    it already (a server infertool launched). ``user_urls``: URLs the user gave on the command line.
    ``launched``: ``url`` is a server infertool started itself (its host must be this machine). A key that is
    withheld is said once per (variable, address) through ``warn`` (default: a warning on stderr), with ``why``
    (default: the URL comes from a file) and how to allow it (``flag``: the command's option for the URL)."""
    environ = os.environ if environ is None else environ
    if value is None:
        value = environ.get(key_env) if key_env else None
    if not value:
        return None
    o = origin(url)
    if o is not None:
        if launched and is_this_machine(o[1]):
            return value
        if not launched and (any(same_origin(url, u) for u in user_urls if u) or allowed_by_env(url, environ)):
            return value
    name = key_env or "the API key"
    where = f"{o[0]}://{o[1]}:{o[2]}" if o else url
    if launched:
        why = "that server listens on an address that is not this machine's"
        how = "serve on 127.0.0.1 (serve.host) or on an IP address of this host"
    else:
        why = why or "that address comes from a file, not from you"
        how = (f"give the URL on the command line ({flag}) or allow it" if flag else "allow it") + f" with {KEY_URLS_VAR}={where}"
    message = f"not sending the key in {name} to {url}: {why}; to send it, {how}"
    if (name, where) not in _warned:
        _warned.add((name, where))
        _say(message, warn)
    return None


def announce_remote_code(model: str, trust: bool, say=None) -> bool:
    """Say once per model that its own Python code will run (``model.trust_remote_code: true``); returns
    ``trust`` so that callers can pass it on."""
    if trust and model not in _announced:
        _announced.add(model)
        _say(f"model.trust_remote_code is true: remote code from {model} will run on this machine", say)
    return trust


def announce_task_code(folder: str, n: int, say=None) -> None:
    """Say once per folder that the code of its lm-eval tasks will run (``eval.lm_eval.trust_code: true``)."""
    if ("tasks", folder) not in _warned:
        _warned.add(("tasks", folder))
        _say(f"eval.lm_eval.trust_code is true: the code of the lm-eval tasks in {folder!r} ({n} reference(s)) will "
             "run on this machine", say)


def _say(message: str, say=None) -> None:
    if say is not None:
        say(message)
        return
    from infertool.output import err

    err.print(f"warning: {message}", markup=False, soft_wrap=True, style="yellow")


REMOTE_CODE_FLAG = "--trust-remote-code"


def is_remote_code_flag(arg: str) -> bool:
    """Whether a vLLM argument turns remote code on or off: --trust-remote-code[=...], --no-trust-remote-code,
    the underscore spelling vLLM also accepts, and the abbreviations argparse accepts (--trust-rem)."""
    flag = str(arg).split("=", 1)[0].strip().lower().replace("_", "-")
    flag = "--" + flag[len("--no-"):] if flag.startswith("--no-") else flag
    return len(flag) >= len("--tr") and REMOTE_CODE_FLAG.startswith(flag)


# --------------------------------------------------------------------------------------------- code loading
# vLLM arguments that import Python code named by their value, or read more arguments from a file this check
# does not see (vLLM 0.1x-0.3x `vllm serve --help`: frontend, worker, structured-output and KV-transfer groups).
CODE_FLAGS = {
    "--middleware": "imports its value (a module:function) into the API server",
    "--tool-parser-plugin": "imports a tool parser from a Python file",
    "--reasoning-parser-plugin": "imports a reasoning parser from a Python file",
    "--worker-extension-cls": "imports a class into every worker",
    "--worker-cls": "imports a worker class",
    "--logits-processors": "imports logits processors by qualified name",
    "--io-processor-plugin": "loads an IO processor plugin",
    "--kv-transfer-config": "may import a KV connector module (kv_connector_module_path)",
    "--config": "reads more vLLM arguments from a file that this check does not see",
    "--allowed-local-media-path": "lets every client read local files under that path",
}
# Exact flags that are prefixes of a code-loading flag but load nothing themselves (argparse takes an exact
# match over an abbreviation).
_PLAIN_FLAGS = {"--reasoning-parser", "--config-format"}
# Environment variables that make a process (vLLM, its workers, the compilers it runs) load other code.
CODE_ENV = {
    "PYTHONPATH": "puts its directories first on Python's import path",
    "PYTHONHOME": "replaces the Python standard library",
    "PYTHONSTARTUP": "runs a Python file at start-up",
    "PYTHONUSERBASE": "adds a user site directory (its .pth files run at start-up)",
    "PYTHONBREAKPOINT": "imports a callable on breakpoint()",
    "PYTHONWARNINGS": "imports warning categories by module path",
    "PYTHONPLATLIBDIR": "changes where Python finds its platform libraries",
    "PYTHONEXECUTABLE": "changes the executable Python reports to subprocesses",
    "VLLM_PLUGINS": "selects which installed vLLM plugins load",
    "VLLM_LOGGING_CONFIG_PATH": "a logging configuration can instantiate any class",
    "BASH_ENV": "runs a file in every non-interactive bash",
    "ENV": "runs a file in every sh",
    "GCONV_PATH": "makes glibc load character-conversion modules from a directory",
    "PATH": "changes which programs (compilers, ninja) vLLM runs",
    "CC": "the C compiler Triton and torch.compile run",
    "CXX": "the C++ compiler torch.compile runs",
}


def code_loading_arg(arg: str) -> str | None:
    """The vLLM flag ``arg`` spells when it loads code (or reads flags from a file): its ``=value``, underscore
    and upper-case spellings and the abbreviations argparse accepts (``--middle`` for ``--middleware``); a
    ``--kv-transfer-config.kv_connector_module_path`` sub-key too. None for every other argument."""
    flag = str(arg).split("=", 1)[0].strip().lower().replace("_", "-")
    if not flag.startswith("--") or flag in _PLAIN_FLAGS:
        return None
    flag = flag.split(".", 1)[0]  # vLLM's --json-arg.key spelling
    if flag in CODE_FLAGS:
        return flag
    if len(flag) < len("--mid"):
        return None
    matches = [f for f in CODE_FLAGS if f.startswith(flag)]
    return matches[0] if matches else None


def code_loading_env(name: str) -> str | None:
    """The variable ``name`` when it makes a process load other code (LD_PRELOAD and every LD_ variable the
    dynamic loader reads, PYTHONPATH and the like, VLLM_PLUGINS); None otherwise."""
    upper = str(name).upper()
    if upper.startswith("LD_") or upper in CODE_ENV:
        return upper
    return None


def code_loading_why(what: str) -> str:
    """What a code-loading flag or variable does (for messages)."""
    if what in CODE_FLAGS:
        return CODE_FLAGS[what]
    if what in CODE_ENV:
        return CODE_ENV[what]
    return "makes the dynamic loader load or look up libraries in every process (LD_PRELOAD loads one into each)"


def announce_code_loading(names, say=None) -> None:
    """Say once per name that a flag or variable the recipe allows (serve.allow_code) loads code."""
    for name in names:
        if ("code", name) in _warned:
            continue
        _warned.add(("code", name))
        _say(f"serve.allow_code allows {name}: it {code_loading_why(name)}", say)
