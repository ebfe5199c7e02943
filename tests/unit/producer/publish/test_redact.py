"""No secrets leave the node: command lines are redacted (producer/publish/redact.py), and of a
process's environment only the variables an identity is made of are ever kept."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuflight.producer.contract import wire
from gpuflight.producer.publish import identity
from gpuflight.producer.publish.redact import REDACTED, cmdline_for, is_secret_name, redact

R = REDACTED


@pytest.mark.parametrize(("argv", "want"), [
    (["train", "--api-key=AK1", "--password", "PW1", "--hf-token", "HF1", "-token", "T1"],
     ["train", f"--api-key={R}", "--password", R, "--hf-token", R, "-token", R]),
    (["env", "TOKEN=T2", "AWS_SECRET_ACCESS_KEY=AS2", "WANDB_API_KEY=W2", "DB_PASS=D2",
      "MASTER_PORT=29500", "python", "x.py"],
     ["env", f"TOKEN={R}", f"AWS_SECRET_ACCESS_KEY={R}", f"WANDB_API_KEY={R}", f"DB_PASS={R}",
      "MASTER_PORT=29500", "python", "x.py"]),
    (["python", "etl.py", "--db", "postgresql://etl:PW3@db.internal:5432/x",
      "--repo=https://ghp_TOKEN3@github.com/o/r.git"],
     ["python", "etl.py", "--db", f"postgresql://{R}@db.internal:5432/x",
      f"--repo=https://{R}@github.com/o/r.git"]),
    (["fetch", "https://bucket.s3.amazonaws.com/k?X-Amz-Credential=C4&X-Amz-Signature=S4"
               "&versionId=7"],
     ["fetch", f"https://bucket.s3.amazonaws.com/k?X-Amz-Credential={R}&X-Amz-Signature={R}"
               "&versionId=7"]),
    (["curl", "-u", "bob:PW5", "-H", "Authorization: Bearer B5", "-H", "X-Api-Key:K5",
      "https://h/x"],
     ["curl", "-u", R, "-H", f"Authorization: {R}", "-H", f"X-Api-Key:{R}", "https://h/x"]),
    (["/usr/bin/mysql", "-pPW6", "-u", "root", "-p", "mydb"],
     ["/usr/bin/mysql", f"-p{R}", "-u", "root", "-p", "mydb"]),
    (["sshpass", "-p", "PW7", "ssh", "host"], ["sshpass", "-p", R, "ssh", "host"]),
    (["redis-cli", "-a", "PW8"], ["redis-cli", "-a", R]),
    # A secret-named flag without a value costs nothing when an option follows it.
    (["tool", "--auth", "--verbose", "--secret"], ["tool", "--auth", "--verbose", "--secret"]),
])
def test_secrets_in_command_lines_are_redacted(argv: list[str], want: list[str]) -> None:
    assert redact(argv) == want


def test_what_is_not_a_secret_stays() -> None:
    """The arguments a GPU job's command line is read for."""
    argv = ["torchrun", "--nproc-per-node", "8", "-p", "29500", "train.py",
            "--max-tokens", "512", "--max-new-tokens", "64", "--tokenizer", "gpt2",
            "--num-key-value-heads", "8", "--keyframes", "3", "--author", "bob",
            "--passes", "3", "--auth-type", "basic", "--batch-size=32", "LOCAL_RANK=0",
            "http://example.com/a?b=1", "app:web"]
    assert redact(argv) == argv


@pytest.mark.parametrize("name", ["password", "DB_PASSWORD", "apiKey", "api-key", "HFToken",
                                  "github_token", "hftoken", "client-secret", "credentials",
                                  "x-auth", "sessionCookie", "PGPASSWORD", "MYSQL_PWD"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["tokenizer", "max-tokens", "num-key-value-heads", "author",
                                  "passes", "keyframes", "bypass", "monkey", "auth-type",
                                  "port", "user", "HOSTNAME"])
def test_names_that_are_not_secret(name: str) -> None:
    assert not is_secret_name(name)


def test_cmdline_modes() -> None:
    argv = ["train", "--password", "PW"]
    assert cmdline_for(argv, "full") == argv
    assert cmdline_for(argv, "redacted") == ["train", "--password", R]
    assert cmdline_for(argv, "none") == []


def test_only_the_identity_variables_are_read_and_the_block_is_zeroed() -> None:
    block = bytearray(b"HF_TOKEN=hf_secret\0SLURM_JOB_ID=42\0PATH=/bin\0SLURM_JOB_ID=43\0"
                      b"POD_NAME=trainer-0\0XPOD_NAMESPACE=not-this\0")
    assert identity.environ_values(block) == {"SLURM_JOB_ID": "42", "POD_NAME": "trainer-0"}
    assert block == bytes(len(block))  # nothing left of the other variables
    first = bytearray(b"POD_NAMESPACE=ml\0")
    assert identity.environ_values(first) == {"POD_NAMESPACE": "ml"}


def test_a_large_environment_is_read_whole(tmp_path: Path) -> None:
    base = tmp_path / "9"
    base.mkdir()
    (base / "environ").write_bytes(b"PADDING=" + b"x" * (200 << 10) + b"\0SLURM_JOB_ID=77\0")
    assert identity._environ(tmp_path, 9) == {"SLURM_JOB_ID": "77"}


def test_a_real_process_s_secrets_are_never_held(tmp_path: Path) -> None:
    """A process started with secrets in its arguments and environment: its identity holds
    its SLURM job and a redacted command line, and neither secret anywhere."""
    secrets = ("sk-ARG-7f3a9c", "ENV-SECRET-51d2e8", "URL-PASS-0c4b1a")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_JOB_ID": "4242",
           "OPENAI_API_KEY": secrets[1]}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('running', flush=True); sys.stdin.read()",
         "--api-key", secrets[0], f"--db=postgresql://u:{secrets[2]}@db/x"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        # Popen returns once the exec closed its pipe, before the kernel has set up the new
        # image's arguments and environment (/proc/PID/environ read empty then, under load):
        # read once the program runs, as the agent does (it maps a runtime by then).
        assert proc.stdout is not None and proc.stdout.readline() == b"running\n"
        who = identity.resolve(Path("/proc"), proc.pid, "node-a")
        full = identity.resolve(Path("/proc"), proc.pid, "node-a", cmdline="full")
    finally:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.close()
        proc.stdout.close()
        proc.wait(10)
    assert who.slurm_job_id == "4242" and who.job == "slurm:4242"
    assert list(who.cmdline[-3:]) == ["--api-key", R, f"--db=postgresql://{R}@db/x"]
    held = repr(dataclasses.asdict(who)) + repr(wire.encode_process(who))
    assert not [s for s in secrets if s in held]
    # In full, the command line is all there is of them; the environment's never is.
    assert secrets[0] in full.cmdline and secrets[1] not in repr(full)


@pytest.mark.parametrize(("args", "mode"), [([], "redacted"), (["--cmdline", "full"], "full"),
                                            (["--cmdline", "none"], "none")])
def test_the_producer_publishes_command_lines_as_asked(args: list[str], mode: str,
                                                       tmp_path: Path) -> None:
    from gpuflight import cli
    from gpuflight.commands.options import kafka_settings

    parsed = cli._parser().parse_args(["producer", "--kafka", "127.0.0.1:9092", *args])
    settings = kafka_settings(parsed)
    assert settings.cmdline == mode
    base = tmp_path / "5"
    base.mkdir()
    (base / "cmdline").write_bytes(b"train\0--password\0PW\0")
    who = identity.resolve(tmp_path, 5, "h", cmdline=settings.cmdline)
    assert list(who.cmdline) == {"full": ["train", "--password", "PW"],
                                 "redacted": ["train", "--password", R], "none": []}[mode]
