"""The rows of a sweep on disk (docs/sweep.md, "Stopping and continuing"): OUT/sweep.csv, one row
per run, written as each run ends, and OUT/sweep.json, the settings its rows were measured
under. A sweep started again into the same OUT continues: the rows there are not measured
again, unless they timed out; a sweep with other settings is refused, so one CSV never mixes
runs that do not compare."""
import csv
import fcntl
import hashlib
import io
import json
import os
import sys

from sweep_plots import FIELDS, typed_row

# Exit status of a run that ran past --timeout: measured again when the sweep continues, as a
# busy machine or a short --timeout may have caused it.
TIMED_OUT = 124


class SweepRefused(Exception):
    """OUT cannot take this sweep's rows; the message says why and what to do."""


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def row_key(row):
    """What a run measured: its length, sp and option set."""
    return (int(row["seq_len"]), int(row["sp"]), int(row["zero_stage"]), str(row["checkpointing"]),
            int(row["head_chunks"]), str(row["tiled_mlp"]), str(row["offload"]),
            int(row.get("ring") or 1))


def replace_file(path, text):
    """Writes text to path through a temporary file and a rename, so that a kill leaves either
    the old file or the new one."""
    temporary = path + ".tmp"
    with open(temporary, "w", newline="") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)


def settings_difference(recorded, settings):
    """The settings that differ, as 'steps 2 there, 5 here', or ''."""
    names = {"config": "--config", "config_sha256": "the config file's contents",
             "steps": "--steps", "set": "--set", "budget_gib": "--budget-gib"}
    differences = []
    for key, name in names.items():
        if recorded.get(key) != settings[key]:
            if key == "config_sha256":
                differences.append(f"{name} changed")
            else:
                differences.append(f"{name} {recorded.get(key)!r} there, {settings[key]!r} here")
    return "; ".join(differences)


class SweepTable:
    """OUT/sweep.csv and OUT/sweep.json. `done` maps row_key to the rows already measured."""

    def __init__(self, out_dir, settings, binary):
        """settings: what the rows must share (settings_difference); binary: the trainer's
        {"binary_sha256", "binary_version"}, recorded beside them."""
        # One sweep at a time in OUT: two would append their rows to one CSV. The kernel drops
        # the lock however this process ends.
        self.lock = open(os.path.join(out_dir, ".lock"), "a")
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.lock.close()
            raise SweepRefused(f"{out_dir} is in use by another sweep: let it end, or choose "
                               "another --out") from None
        self.csv_path = os.path.join(out_dir, "sweep.csv")
        self.json_path = os.path.join(out_dir, "sweep.json")
        self.rows = []
        self.done = {}
        if os.path.exists(self.csv_path):
            self._continue(settings, binary)
        else:
            replace_file(self.json_path,
                         json.dumps(dict(settings, **binary), indent=2) + "\n")
            replace_file(self.csv_path, ",".join(FIELDS) + "\r\n")
        self.file = open(self.csv_path, "a", newline="")
        self.writer = csv.DictWriter(self.file, fieldnames=FIELDS)

    def _continue(self, settings, binary):
        if not os.path.exists(self.json_path):
            raise SweepRefused(
                f"{self.csv_path} holds a sweep whose settings were not recorded (no sweep.json "
                "beside it): its rows may not compare with this sweep's. Choose another --out, or "
                "remove that folder to start again")
        try:
            with open(self.json_path) as f:
                recorded = json.load(f)
            if not isinstance(recorded, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as error:
            raise SweepRefused(f"{self.json_path} cannot be read ({error}): choose another --out, "
                               "or remove that folder to start again") from None
        difference = settings_difference(recorded, settings)
        if difference:
            raise SweepRefused(
                f"{os.path.dirname(self.csv_path) or '.'} holds a sweep with other settings "
                f"({difference}): its rows would not compare with this sweep's. Run it again "
                "with the same settings to continue it, choose another --out, or remove that "
                "folder to start again")
        if recorded.get("binary_sha256") != binary["binary_sha256"]:
            print(f"sweep: warning: the trainer binary changed ({recorded.get('binary_version')} "
                  f"there, {binary['binary_version']} here) since the rows already in "
                  f"{self.csv_path} were measured; they are kept as measured by the earlier build",
                  file=sys.stderr)
        with open(self.csv_path, newline="") as f:
            lines = f.read().splitlines(keepends=True)
        header = ",".join(FIELDS)
        # A sweep from before --ring has its header without the last column; its rows are ring 1
        # and are written back with the whole header.
        upgraded = bool(lines) and lines[0].rstrip("\r\n") == ",".join(FIELDS[:-1])
        if not lines or (lines[0].rstrip("\r\n") != header and not upgraded):
            raise SweepRefused(f"{self.csv_path} does not start with the sweep's header ({header})")
        # A sweep killed while writing a row leaves it without its line end.
        torn = not lines[-1].endswith("\n")
        whole = lines[:-1] if torn else lines
        kept, again = [], 0
        for row in csv.DictReader(whole):
            if int(row["exit_status"]) == TIMED_OUT:
                again += 1
                continue
            if upgraded:
                row["ring"] = 1
            kept.append(row)
        if torn or again or upgraded:
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(kept)
            replace_file(self.csv_path, text.getvalue())
        for row in kept:
            self._remember(typed_row(row))
        print(f"sweep: continuing the sweep in {self.csv_path}: {len(kept)} run(s) already measured"
              + (f", {again} that timed out measured again" if again else "")
              + (", a torn last row dropped" if torn else ""), flush=True)

    def _remember(self, row):
        self.rows.append(row)
        self.done[row_key(row)] = row

    def record(self, row):
        self.writer.writerow(row)
        self.file.flush()
        os.fsync(self.file.fileno())
        self._remember(row)

    def close(self):
        self.file.close()
        self.lock.close()
