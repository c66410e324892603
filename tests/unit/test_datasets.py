"""The prompt sets (vllm_selfspec/builders/datasets.py): the long-prompt set is made of the
short set's articles, LONG_ARTICLES to a prompt, and asks for the last one's summary."""

from vllm_selfspec.builders import datasets


def test_long_prompts_are_the_short_sets_articles_in_groups():
    short = dict(datasets.load_items("xsum", "all"))
    long = datasets.load_items("xsum-long", "all")
    assert len(long) == len(short) // datasets.LONG_ARTICLES
    item_id, text = long[0]
    articles = text.split("\n\nArticle ")
    assert len(articles) == datasets.LONG_ARTICLES
    assert text.endswith(f"Summarize article {datasets.LONG_ARTICLES} in one sentence.")
    first = short[item_id[len("xsum-long-"):]].split("\n\n", 1)[1]
    assert articles[0] == f"Article 1:\n{first}"
    assert {i for i, _ in datasets.load_items("xsum-long", "dev")}.isdisjoint(
        i for i, _ in datasets.load_items("xsum-long", "test"))
