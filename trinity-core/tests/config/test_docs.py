"""docs/configuration.md is generated from the models and must not drift from them."""

from __future__ import annotations

from pathlib import Path

from trinity.config import Config
from trinity.config.docs import iter_models, render_markdown, undocumented_fields

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"


def test_every_key_has_a_description() -> None:
    assert undocumented_fields() == []


def test_committed_doc_is_up_to_date() -> None:
    assert DOC.read_text() == render_markdown(), (
        "docs/configuration.md is out of date; regenerate it with "
        "`python -m trinity.config.docs > docs/configuration.md`"
    )


def test_doc_names_every_key_of_every_section() -> None:
    text = render_markdown()
    for path, model in iter_models():
        heading = f"## `{path}`" if path else "## Top level"
        assert heading in text
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        for name in model.model_fields:
            assert f"| `{name}` |" in section, f"{path}.{name} missing from the docs"


def test_sections_are_documented_where_users_meet_them() -> None:
    paths = {model.__name__: path for path, model in iter_models(Config)}
    assert paths["TasksetConfig"] == "buffer.explorer_input.tasksets[]"
    assert paths["ExperienceBufferConfig"] == "buffer.trainer_input.experience_buffer"
    assert paths["InferenceModelConfig"] == "explorer.rollout_model"
