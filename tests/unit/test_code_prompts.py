"""builders.code_prompts and the coding sets of builders.task_prompts: requests around the
documented public functions of Python's standard library."""

import textwrap

from vllm_selfspec.builders import code_prompts as cp
from vllm_selfspec.builders import task_prompts as tp

MODULE = textwrap.dedent('''
    def area(width, height=1):
        """Return the area of a rectangle of this width and height.

        More detail that the summary leaves out.
        """
        return width * height

    def _private(x):
        """A private helper that nobody should ask for by name."""

    def shown(x):
        """Example only.

        >>> shown(1)
        """

    def short(x):
        """Too short."""

    class Shape:
        def scale(self, factor, *rest, by=None, **opts):
            """Scale the shape by a factor around its own centre point."""
            return factor
''')


def test_rows_are_the_documented_public_functions_with_their_source(tmp_path):
    (tmp_path / "geometry.py").write_text(MODULE)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_geometry.py").write_text(MODULE)  # a test folder: skipped
    rows = list(cp.iter_functions(tmp_path))
    assert [(r["module"], r["signature"]) for r in rows] == [
        ("geometry", "area(width, height)"),
        ("geometry", "scale(factor, *rest, by, **opts)")]
    assert rows[0]["summary"] == "Return the area of a rectangle of this width and height."
    # a method's source is dedented as a whole, its body kept
    assert rows[1]["source"].startswith("def scale(self")
    assert rows[1]["source"].splitlines()[-1] == "    return factor"


def test_coding_sets_put_every_form_around_a_library_function():
    for name, forms, field in (("code-requests", tp._WRITE_FORMS, "summary"),
                               ("code-review", tp._READ_FORMS, "source")):
        convs = tp.task_prompts(name, decontaminate=False)
        assert len(convs) > 500
        used = {f for c in convs for f in forms if c.prompt.startswith(f.split("{")[0])}
        assert used == set(forms), name
        row = cp.stdlib_functions()[0]
        assert row[field].splitlines()[0] in tp.SOURCES[name][1](row)[0]


def test_a_function_too_long_to_show_is_not_asked_about():
    long_row = {"module": "m", "name": "f", "signature": "f()", "summary": "Do a thing well.",
                "source": "def f():\n" + "    pass\n" * 400}
    assert tp._code_review(long_row) == ("", "")
    assert tp._code_requests(long_row)[0]  # asking for it by its description still works
