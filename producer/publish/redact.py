"""Secrets out of command lines before they leave the node (the processes topic).

`redact(argv)` keeps the shape of a command line and replaces what looks like a secret with
`<redacted>`:

  --api-key=abc, --password abc, -token abc     values of options whose name says secret
  TOKEN=abc, AWS_SECRET_ACCESS_KEY=abc          values of NAME=value arguments (env, make)
  Authorization: Bearer abc                     values of header-like arguments
  https://user:pass@host/…, …?token=abc         a URL's user information, and secret query
                                                values, wherever a URL appears in an argument
  mysql -pabc, sshpass -p abc, curl -u u:p      the few programs whose short options carry one

A name "says secret" when one of its words (split at -, _, . and camelCase) is a secret word
(token, secret, password, passwd, pwd, credential(s), …), when its last word is a weaker one
(key, pass, auth, cookie, signature: `--api-key`, not `--num-key-value-heads`), or when it
is one word holding a long one (`dbpassword`, `hftoken`). It errs on the side of hiding: a
secret-named flag that takes no value costs the argument after it, unless that is an option.
Pure: no I/O, no state.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final, Literal

CmdlineMode = Literal["full", "redacted", "none"]
CMDLINE_MODES: Final[tuple[CmdlineMode, ...]] = ("full", "redacted", "none")
REDACTED: Final = "<redacted>"

#: Words that make a name secret wherever they are in it.
SECRET_WORDS: Final = frozenset({
    "password", "passwd", "passphrase", "pwd", "secret", "secrets", "token", "apikey",
    "credential", "credentials", "creds", "authorization", "jwt", "bearer", "privatekey",
    "accesskey",
})
#: Words that make a name secret only as its last word: `--api-key`, `--db-pass`,
#: `--basic-auth`, but not `--num-key-value-heads`, `--pass-through`, `--auth-type`.
LAST_SECRET_WORDS: Final = frozenset({
    "key", "keys", "pass", "auth", "oauth", "cookie", "cookies", "signature", "sig", "cred",
    "dsn", "sas",
})
#: Pieces that make a name written as one word secret (`hfpassword`, `GITHUBTOKEN`): anywhere,
#: and "token" at the end only (`--tokenizer` and `--max-tokens` are not secrets).
SECRET_PARTS: Final = ("password", "passwd", "passphrase", "secret", "apikey", "credential",
                       "privatekey", "accesskey", "authorization")
SECRET_SUFFIXES: Final = ("token", "apikey", "pwd")
#: Programs whose short options carry a secret: program → options taking it (attached to the
#: option: `-pSECRET`, or as the next argument where `attached_only` is False).
PROGRAM_OPTIONS: Final[dict[str, tuple[frozenset[str], bool]]] = {
    # mysql's -p takes its password attached only (`-p x` prompts, and x is the database).
    **{name: (frozenset({"-p"}), True)
       for name in ("mysql", "mysqldump", "mysqladmin", "mariadb", "mariadb-dump",
                    "mariadb-admin")},
    "sshpass": (frozenset({"-p"}), False),
    "redis-cli": (frozenset({"-a"}), False),
    "curl": (frozenset({"-u", "--user", "-U", "--proxy-user"}), False),
}

_WORDS: Final = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")
_OPTION: Final = re.compile(r"(--?)([A-Za-z][\w.-]*)(=)(.*)", re.S)
_ENV_STYLE: Final = re.compile(r"([A-Za-z_][\w.]*)(=)(.*)", re.S)
_HEADER: Final = re.compile(r"([A-Za-z][\w-]*)(:\s*)(\S.*)", re.S)
#: scheme://userinfo@ — the userinfo goes, whatever it is (a token is often all of it).
_USERINFO: Final = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@\s]+)@")
#: ?name=value / &name=value / ;name=value in URLs.
_QUERY: Final = re.compile(r"([?&;])([^=&;#\s]+)=([^&;#\s]*)")


def is_secret_name(name: str) -> bool:
    """Whether an option, variable or header name says its value is a secret."""
    compact = re.sub(r"[^a-z0-9]", "", name.lower())
    if any(part in compact for part in SECRET_PARTS) or compact.endswith(SECRET_SUFFIXES):
        return True
    words = [w.lower() for w in _WORDS.findall(name)]
    return bool(words) and (not SECRET_WORDS.isdisjoint(words) or words[-1] in LAST_SECRET_WORDS)


def redact_urls(text: str) -> str:
    """`text` with the user information of its URLs, and their secret query values, hidden."""
    if "://" not in text:
        return text
    text = _USERINFO.sub(lambda m: f"{m[1]}{REDACTED}@", text)
    return _QUERY.sub(lambda m: f"{m[1]}{m[2]}={REDACTED}" if is_secret_name(m[2]) else m[0],
                      text)


def _program(argv: Sequence[str]) -> str:
    return argv[0].rsplit("/", 1)[-1] if argv else ""


def redact(argv: Sequence[str]) -> list[str]:
    """argv with its secrets replaced by `<redacted>` (see the module's docstring)."""
    out: list[str] = []
    options, attached_only = PROGRAM_OPTIONS.get(_program(argv), (frozenset(), True))
    hide_next = False
    for index, arg in enumerate(argv):
        if hide_next:
            hide_next = False
            # A secret option followed by another option was a flag, not a value.
            if not (arg.startswith("-") and len(arg) > 1):
                out.append(REDACTED)
                continue
        if index == 0:
            out.append(redact_urls(arg))
            continue
        out.append(_redact_one(arg, options, attached_only))
        if out[-1] == arg and _takes_next(arg, options, attached_only):
            hide_next = True
    return out


def _takes_next(arg: str, options: frozenset[str], attached_only: bool) -> bool:
    """Whether `arg` is an option naming a secret whose value is the next argument."""
    if arg in options:
        return not attached_only
    if not arg.startswith("-") or "=" in arg or arg == "--":
        return False
    return is_secret_name(arg.lstrip("-"))


def _redact_one(arg: str, options: frozenset[str], attached_only: bool) -> str:
    option = _OPTION.fullmatch(arg)
    if option is not None:
        if is_secret_name(option[2]) or option[1] + option[2] in options:
            return f"{option[1]}{option[2]}={REDACTED}"
        return f"{option[1]}{option[2]}={redact_urls(option[4])}"
    for short in options:  # -pSECRET
        if not short.startswith("--") and arg.startswith(short) and len(arg) > len(short):
            return f"{short}{REDACTED}"
    if not arg.startswith("-"):
        env = _ENV_STYLE.fullmatch(arg)
        if env is not None and is_secret_name(env[1]):
            return f"{env[1]}={REDACTED}"
        header = _HEADER.fullmatch(arg)
        if header is not None and "://" not in arg and is_secret_name(header[1]):
            return f"{header[1]}{header[2]}{REDACTED}"
    return redact_urls(arg)


def cmdline_for(argv: Sequence[str], mode: CmdlineMode) -> list[str]:
    """What the processes topic carries of a command line: all of it, redacted, or nothing."""
    if mode == "full":
        return list(argv)
    if mode == "none":
        return []
    return redact(argv)
