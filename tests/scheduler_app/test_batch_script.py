"""Batch scripts' #SBATCH and #ATTUNE directives read as submission fields, as sbatch reads them."""

from __future__ import annotations

import shlex
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_app.batch_script import (
    DIRECTIVES,
    UNSUPPORTED,
    DirectiveError,
    directive_help,
    parse_directives,
    parse_time_limit_s,
)
from tests.standalone import ROOT, standalone_env


def script(*directives: str, body: str = "python train.py\n") -> str:
    return "#!/bin/bash\n" + "".join(f"{line}\n" for line in directives) + body


def fields(*directives: str) -> dict:
    return parse_directives(script(*directives))


@pytest.mark.parametrize(
    ("directive", "expected"),
    [
        ("#SBATCH --job-name=train", {"name": "train"}),
        ("#SBATCH --job-name train", {"name": "train"}),
        ("#SBATCH -J train", {"name": "train"}),
        ("#SBATCH -Jtrain", {"name": "train"}),
        ('#SBATCH --job-name="my run"', {"name": "my run"}),
        ("#SBATCH --gpus=2", {"num_gpus": 2}),
        ("#SBATCH --gpus 2", {"num_gpus": 2}),
        ("#SBATCH -G 4", {"num_gpus": 4}),
        ("#SBATCH --gpus=a100:3", {"num_gpus": 3}),
        ("#SBATCH --gres=gpu:2", {"num_gpus": 2}),
        ("#SBATCH --gres gpu:a100:8", {"num_gpus": 8}),
        ("#SBATCH --gres=gpu", {"num_gpus": 1}),
        ("#SBATCH --gres=gpu:v100", {"num_gpus": 1}),
        ("#SBATCH --nodes=2", {"nodes": 2}),
        ("#SBATCH -N 3", {"nodes": 3}),
        ("#SBATCH --time=30", {"time_limit_s": 1800}),
        ("#SBATCH -t 1-00:00:00", {"time_limit_s": 86400}),
        ("#SBATCH --array=0-9%2", {"array": "0-9%2"}),
        ("#SBATCH -a 1,3,5-7", {"array": "1,3,5-7"}),
        ("#SBATCH --dependency=afterok:41", {"depends_on": [41]}),
        ("#SBATCH -d afterok:41:42", {"depends_on": [41, 42]}),
        ("#SBATCH --dependency=afterok:41:42,afterok:43:41", {"depends_on": [41, 42, 43]}),
        ("#SBATCH --output=logs/%x-%j_%a.out", {"output": "logs/%x-%j_%a.out"}),
        ("#SBATCH -o out.%u", {"output": "out.%u"}),
        ("#SBATCH --error=err-%j.log", {"error": "err-%j.log"}),
        ("#SBATCH -e err", {"error": "err"}),
        ("#SBATCH --chdir=/shared/alice/run", {"chdir": "/shared/alice/run"}),
        ("#SBATCH -D /scratch", {"chdir": "/scratch"}),
        ("#SBATCH --hold", {"hold": True}),
        ("#SBATCH -H", {"hold": True}),
        ("#SBATCH --cpus-per-gpu=6", {"cpus_per_gpu": 6.0}),
        ("#SBATCH --cpus-per-gpu 2.5", {"cpus_per_gpu": 2.5}),
        ("#SBATCH --mem-per-gpu=16G", {"mem_gb_per_gpu": 16.0}),
        ("#ATTUNE --iters=20000", {"total_iters": 20000}),
        ("#ATTUNE --team vision", {"team": "vision"}),
        ("#ATTUNE --priority=10", {"priority": 10}),
        ("#ATTUNE --priority -5", {"priority": -5}),
        ("#ATTUNE --max-latency=6h", {"qos_max_latency_s": 21600.0}),
        ("#ATTUNE --max-latency 1-00:00:00", {"qos_max_latency_s": 86400.0}),
        ("#ATTUNE --deadline 2026-11-23T18:00+01:00", {"qos_deadline_at": "2026-11-23T18:00+01:00"}),
        ("#ATTUNE --min-rate 2.5", {"qos_min_rate_iters_per_s": 2.5}),
        ("#ATTUNE --checkpoint-every 10m", {"checkpoint_every_s": 600.0}),
        ("#ATTUNE --gpus=2 --hold", {"num_gpus": 2, "hold": True}),  # Slurm's options on #ATTUNE too
    ],
)
def test_each_supported_directive_in_each_form(directive, expected):
    assert fields(directive) == expected


def test_a_deadline_in_sbatchs_forms_is_the_moment_it_names_at_submission():
    """`now+2hours` is read when the script is (at submission), as an aware time in this process's zone
    (the service's); an ISO time stays as typed, for the service to read in its zone."""
    before = datetime.now().astimezone()
    moment = datetime.fromisoformat(fields("#ATTUNE --deadline now+2hours")["qos_deadline_at"])
    after = datetime.now().astimezone()
    assert moment.tzinfo is not None
    assert before + timedelta(hours=2) - timedelta(seconds=1) <= moment <= after + timedelta(hours=2)
    tomorrow = datetime.fromisoformat(fields("#ATTUNE --deadline=tomorrow")["qos_deadline_at"])
    assert (tomorrow.hour, tomorrow.minute) == (0, 0) and tomorrow > after
    evening = datetime.fromisoformat(fields("#ATTUNE --deadline 18:00")["qos_deadline_at"])
    assert (evening.hour, evening.minute) == (18, 0) and after < evening <= after + timedelta(days=1)
    dated = datetime.fromisoformat(fields("#ATTUNE --deadline=12/24-18:00")["qos_deadline_at"])
    assert (dated.month, dated.day, dated.hour) == (12, 24, 18) and after < dated <= after + timedelta(
        days=366
    )


def test_several_options_on_a_line_and_later_directives_win():
    assert fields(
        "#SBATCH -J a --gpus=2 -N 2 --time 10:00 # two nodes for ten minutes",
        "#SBATCH --job-name=b",
        "#ATTUNE --iters 5 --team vision",
    ) == {"name": "b", "num_gpus": 2, "nodes": 2, "time_limit_s": 600, "total_iters": 5, "team": "vision"}


def test_directives_are_read_only_before_the_first_command():
    text = (
        "#!/bin/bash\n"
        "\n"
        "# plain comments and blank lines keep the header going\n"
        "#SBATCH --gpus=2\n"
        "   \n"
        "  #SBATCH --gpus=7\n"  # not at the line's start: a comment to sbatch too
        "## SBATCH --nodes=2\n"  # commented out
        "# SBATCH --nodes=3\n"
        "#SBATCHX --nodes=4\n"
        "#SBATCH --job-name=header\n"
        "module load cuda\n"
        "#SBATCH --gpus=abc\n"  # after a command: a comment, not even an error
        "#SBATCH --job-name=body\n"
        "python train.py\n"
    )
    assert parse_directives(text) == {"num_gpus": 2, "name": "header"}


def test_a_script_without_directives_or_a_shebang():
    assert parse_directives("") == {}
    assert parse_directives("python train.py\n#SBATCH --gpus=2\n") == {}
    assert parse_directives("\ufeff#SBATCH --gpus=2\r\n#SBATCH\r\necho\r\n") == {"num_gpus": 2}


@pytest.mark.parametrize(
    ("typed", "seconds"),
    [
        ("45", 2700),  # minutes
        ("10:30", 630),  # minutes:seconds
        ("90:00", 5400),  # the first field may be any size
        ("02:00:00", 7200),  # hours:minutes:seconds
        ("48:00:00", 172800),
        ("1-12", 129600),  # days-hours
        ("1-12:30", 131400),  # days-hours:minutes
        ("2-00:00:10", 172810),  # days-hours:minutes:seconds
        ("0:30", 30),
        ("2h", 7200),  # Attune's suffixes, as the command line's --time
        ("1h30m", 5400),
        ("90s", 90),
    ],
)
def test_time_formats(typed, seconds):
    assert fields(f"#SBATCH --time={typed}") == {"time_limit_s": seconds}


@pytest.mark.parametrize(
    ("typed", "gb"),
    [
        ("4096", 4.0),
        ("512M", 0.5),
        ("16G", 16.0),
        ("16g", 16.0),
        ("1T", 1024.0),
        ("1048576K", 1.0),
        ("1.5G", 1.5),
    ],
)
def test_mem_per_gpu_units_default_to_megabytes_as_slurm(typed, gb):
    assert fields(f"#SBATCH --mem-per-gpu={typed}") == {"mem_gb_per_gpu": gb}


@pytest.mark.parametrize(
    ("directive", "reason"),
    [
        # malformed values
        ("#SBATCH --gpus=abc", "--gpus needs a whole number of GPUs"),
        ("#SBATCH --gpus=0", "--gpus needs a whole number of GPUs"),
        ("#SBATCH -G -1", "-G needs a whole number of GPUs"),
        ("#SBATCH --gres=gpu:0", "--gres needs a whole number of GPUs"),
        ("#SBATCH --gres=shard:2", "--gres takes gpu:N or gpu:TYPE:N"),
        ("#SBATCH --gres=gpu:2,shard:1", "--gres takes gpu:N or gpu:TYPE:N"),
        ("#SBATCH --nodes=2-4", "a range of node counts is not supported"),
        ("#SBATCH -N two", "-N needs a whole number of nodes"),
        ("#SBATCH --time=UNLIMITED", "leave the directive out"),
        ("#SBATCH --time=infinite", "leave the directive out"),
        ("#SBATCH --time=0", "positive duration"),
        ("#SBATCH --time=1:60", "0-59"),
        ("#SBATCH --time=1:60:00", "0-59"),
        ("#SBATCH --time=1-24", "hours must be 0-23"),
        ("#SBATCH --time=soon", "--time takes MM, MM:SS, HH:MM:SS"),
        ("#SBATCH --time=1:2:3:4", "--time takes MM"),
        ("#SBATCH --dependency=afterany:41", "only afterok:ID[:ID...] is supported ('afterany' is not)"),
        ("#SBATCH --dependency=singleton", "only afterok"),
        ("#SBATCH --dependency=afterok:41?afterok:42", "'?' (any of) is not supported"),
        ("#SBATCH --dependency=afterok:41_3", "plain job ids"),
        ("#SBATCH --dependency=afterok:", "plain job ids"),
        ("#SBATCH --cpus-per-gpu=0", "--cpus-per-gpu needs a positive number"),
        ("#SBATCH --cpus-per-gpu=lots", "--cpus-per-gpu needs a positive number"),
        ("#SBATCH --mem-per-gpu=16X", "--mem-per-gpu needs a positive size"),
        ("#SBATCH --mem-per-gpu=0", "--mem-per-gpu needs a positive size"),
        ("#SBATCH --mem-per-gpu=" + "9" * 400, "--mem-per-gpu needs a positive size"),
        ("#SBATCH --output=", "--output needs a value"),
        ("#SBATCH --job-name", "--job-name needs a value: --job-name NAME"),
        ("#SBATCH --hold=yes", "--hold takes no value"),
        ("#SBATCH --job-name='unclosed", "cannot split the line"),
        ("#SBATCH train.sh", "'train.sh' is not an option"),
        ("#ATTUNE --iters=many", "--iters needs a whole number of iterations"),
        ("#ATTUNE --priority=high", "--priority needs a whole number"),
        ("#ATTUNE --max-latency=soon", "--max-latency takes"),
        ("#ATTUNE --deadline=someday", "--deadline takes an ISO date and time or sbatch's forms"),
        ("#ATTUNE --deadline=now+2fortnights", "after now+ give a count and a unit"),
        # unknown, and Slurm options Attune does not take, with what to use instead
        ("#SBATCH --frobnicate=1", "--frobnicate is not a directive Attune knows"),
        ("#SBATCH -Z", "-Z is not a directive Attune knows"),
        ("#SBATCH --gpu=2", "--gpu is not a directive"),  # no abbreviations
        ("#SBATCH --partition=gpu", "--partition is not supported: Attune has one pool of GPUs; charge"),
        ("#SBATCH -p gpu", "--partition is not supported"),
        ("#SBATCH -A lab", "#ATTUNE --team NAME"),
        ("#SBATCH --mem=64G", "--mem is not supported: use --mem-per-gpu"),
        ("#SBATCH -c 8", "--cpus-per-task is not supported: use --cpus-per-gpu"),
        ("#SBATCH --ntasks-per-node=4", "torchrun"),
        ("#SBATCH --gpus-per-node=4", "give the job's total with --gpus"),
        ("#SBATCH --mail-type=END", "Attune sends no mail"),
        ("#SBATCH --exclusive", "always its own"),
        ("#SBATCH --qos=high", "#ATTUNE --deadline"),
        ("#SBATCH --time-min=10", "--time-min is not supported"),
        ("#ATTUNE --workload res18", "a script is its own command"),
        # Attune's own options would make sbatch refuse the script
        ("#SBATCH --iters=10", "--iters is Attune's own: put it on an #ATTUNE line"),
        ("#SBATCH --team=vision", "put it on an #ATTUNE line"),
    ],
)
def test_a_bad_directive_is_refused_naming_its_line(directive, reason):
    text = script("#SBATCH --gpus=1", "# fine so far", directive)
    with pytest.raises(DirectiveError) as caught:
        parse_directives(text)
    error = caught.value
    assert isinstance(error, ValueError) and error.line_no == 4
    assert str(error).startswith(f"line 4: {directive[:70]}")  # a long line is shown cut
    assert reason in str(error)


def test_the_message_reads_as_the_issue_shows_it():
    with pytest.raises(DirectiveError, match=r"^line 2: #SBATCH --gpus=abc: --gpus needs a whole number"):
        parse_directives("#!/bin/bash\n#SBATCH --gpus=abc\n")


def test_the_first_bad_line_is_the_one_named_and_long_lines_are_cut():
    long_name = "x" * 200
    with pytest.raises(DirectiveError) as caught:
        parse_directives(f"#SBATCH --job-name={long_name} --mem=1G\n#SBATCH --partition=a\n")
    assert caught.value.line_no == 1 and "...: --mem is not supported" in str(caught.value)
    assert len(str(caught.value)) < 200


def test_every_unsupported_option_has_a_message():
    for option in UNSUPPORTED:
        with pytest.raises(DirectiveError, match=f"--{option} is not supported"):
            parse_directives(f"#ATTUNE --{option}=1\n")


def test_the_help_lists_every_directive():
    text = directive_help()
    for directive in DIRECTIVES:
        assert f"--{directive.long}" in text
        assert not directive.short or f"-{directive.short}, --{directive.long}" in text
    assert "#ATTUNE" in text and "#SBATCH" in text


# --- a property: what a script says is what it parses to ---------------------------------------

# Names with spaces, quotes and backslashes: the script quotes them as a shell would.
_names = st.text(alphabet="abcXYZ019 _-.()[]'\"\\$%", min_size=1, max_size=20).filter(
    lambda s: s.strip() == s
)
_paths = st.text(alphabet="abcXYZ019_./%-", min_size=1, max_size=30).filter(lambda s: not s.startswith("-"))
_positive_floats = st.floats(min_value=0.25, max_value=512, allow_nan=False).map(lambda x: round(x, 2))


@st.composite
def _times(draw: st.DrawFn) -> tuple[str, int]:
    days = draw(st.integers(0, 30))
    hours, minutes, seconds = draw(st.integers(0, 23)), draw(st.integers(0, 59)), draw(st.integers(0, 59))
    total = days * 86400 + hours * 3600 + minutes * 60 + seconds
    if total == 0:
        return "1", 60
    return f"{days}-{hours:02}:{minutes:02}:{seconds:02}", total


@st.composite
def _mems(draw: st.DrawFn) -> tuple[str, float]:
    gb = draw(st.integers(1, 2048))
    return draw(
        st.sampled_from([(f"{gb}G", float(gb)), (f"{gb * 1024}", float(gb)), (f"{gb * 1024}M", float(gb))])
    )


_VALUES = {
    "job-name": _names.map(lambda s: (s, s)),
    "gpus": st.integers(1, 4096).map(lambda n: (str(n), n)),
    "gres": st.tuples(st.sampled_from(["gpu:", "gpu:a100:"]), st.integers(1, 4096)).map(
        lambda t: (f"{t[0]}{t[1]}", t[1])
    ),
    "nodes": st.integers(1, 512).map(lambda n: (str(n), n)),
    "time": _times(),
    "array": st.sampled_from(["0-9", "1,3,5-7", "0-15:4", "0-99%10"]).map(lambda s: (s, s)),
    "dependency": st.lists(st.integers(1, 10**9), min_size=1, max_size=5, unique=True).map(
        lambda ids: ("afterok:" + ":".join(map(str, ids)), ids)
    ),
    "output": _paths.map(lambda s: (s, s)),
    "error": _paths.map(lambda s: (s, s)),
    "chdir": _paths.map(lambda s: (s, s)),
    "hold": st.just(("", True)),
    "cpus-per-gpu": _positive_floats.map(lambda x: (str(x), x)),
    "mem-per-gpu": _mems(),
    "iters": st.integers(1, 10**12).map(lambda n: (str(n), n)),
    "team": _paths.map(lambda s: (s, s)),
    "priority": st.integers(-100, 100).map(lambda n: (str(n), n)),
    "max-latency": st.integers(1, 10**6).map(lambda s: (f"{s}s", float(s))),
    "deadline": st.sampled_from(["2026-11-23T18:00", "2027-01-02T03:04:05+01:00"]).map(lambda s: (s, s)),
    "min-rate": _positive_floats.map(lambda x: (str(x), x)),
    "checkpoint-every": st.integers(1, 10**6).map(lambda s: (f"{s}s", float(s))),
}


@st.composite
def _scripts(draw: st.DrawFn) -> tuple[str, dict]:
    chosen = draw(st.lists(st.sampled_from(DIRECTIVES), unique_by=lambda d: d.field, min_size=1))
    expected, words = {}, []
    for directive in chosen:
        typed, value = draw(_VALUES[directive.long])
        expected[directive.field] = value
        spelled = f"-{directive.short}" if directive.short and draw(st.booleans()) else f"--{directive.long}"
        if not directive.metavar:
            words.append([spelled])
        elif spelled.startswith("--") and draw(st.booleans()):
            words.append([f"{spelled}={shlex.quote(typed)}"])
        else:
            words.append([spelled, shlex.quote(typed)])
    lines, line, attune_only = [], [], False
    for directive, word in zip(chosen, words, strict=True):
        line, attune_only = line + word, attune_only or directive.attune_only
        if draw(st.booleans()):  # end the line here, or carry on with more options on it
            lines.append(("#ATTUNE " if attune_only or draw(st.booleans()) else "#SBATCH ", line))
            line, attune_only = [], False
    if line:
        lines.append(("#ATTUNE ", line))
    header = "".join(prefix + " ".join(w) + "\n" for prefix, w in lines)
    return f"#!/bin/bash\n# generated\n{header}\npython train.py\n#SBATCH --gpus=nope\n", expected


@given(_scripts())
def test_a_script_of_valid_directives_parses_back_to_their_values(case):
    text, expected = case
    assert parse_directives(text) == expected


def test_the_forms_time_limit_takes_the_same_formats():
    assert parse_time_limit_s("1-12:00:00") == 129600 and parse_time_limit_s("30m") == 1800
    with pytest.raises(ValueError, match="time limit takes MM"):
        parse_time_limit_s("soon")


def test_the_parser_imports_no_framework():
    code = (
        "import sys, scheduler_app.batch_script\n"
        "assert not [m for m in sys.modules if m.startswith(('django', 'rest_framework'))]"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=standalone_env(), capture_output=True)
    assert run.returncode == 0, run.stderr
