"""docs/configuration.md and docs/rewards.md show every option and reward as the code describes
them (mmrl/reference.py): a field's type, default and comment, a reward's range, parameters and
docstring. A page the code has moved past fails here with the command that refreshes it."""
import dataclasses

import pytest

from mmrl import config, reference
from rewards import REWARDS


def test_the_generated_pages_are_current():
    assert reference.stale() == [], "run `python -m mmrl.reference` and commit docs/"


def test_an_option_row_shows_legal_values_default_and_the_comment_beside_it():
    table = reference.options_markdown()
    assert ("| `on_bad_sample` | error \\| skip | `\"error\"` | error: stop naming record and "
            "file \\| skip: count |") in table
    # A comment block above a field is its description; `train` is required.
    assert "| `train` | str | required |" in table
    assert "| `prompt_template` | str, or null | `null` | Anchor prompt template" in table


def test_every_field_of_every_section_is_listed_once():
    table = reference.options_markdown()
    for prefix, cls in reference._sections(config.RunConfig, ""):
        for f in dataclasses.fields(cls):
            if reference._dataclass_of(f.type) is None:
                shown = "rewards[]" if prefix == "rewards" else prefix
                section = table.split(f"### `{shown}`", 1)[1].split("\n### ", 1)[0]
                assert section.count(f"| `{f.name}` |") == 1, (prefix, f.name)


def test_every_registered_reward_has_a_row_with_its_parameters():
    table = reference.rewards_markdown()
    for name in REWARDS.names():
        assert f"| `{name}` |" in table, name
    assert "`threshold=0.5`" in table.split("| `detection` |")[1].splitlines()[0]


def test_a_page_without_markers_is_an_error_naming_it(tmp_path):
    page = tmp_path / "configuration.md"
    page.write_text("# Configuration\n")
    with pytest.raises(SystemExit, match="configuration.md: no generated block"):
        reference._render(page, "table")
