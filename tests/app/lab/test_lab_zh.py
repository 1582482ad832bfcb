"""Issue 42 item 1 in the lab: a real result (the batching experiment at size ci, on the
embedded model) drawn in Chinese: the sentences, the table, the figures and the exported HTML
page speak Chinese with no English prose left (numbers, units, model names and code words
stay); the JSON export keeps its English keys and sentences; English is drawn as before."""
from __future__ import annotations

import json

import pytest

from app.classroom.lab_stage import result_html
from app.lab import Progress, experiments, run
from app.lab.export import figures, headline_rows, sentences_in, to_html
from app.page.lab_tab import LabRun, progress_html
from tests.app.lab.english_left import english_words, figure_texts, visible_text
from visualizers.lab_words import word

pytestmark = pytest.mark.filterwarnings("ignore:.*no_silent_downcasting")


@pytest.fixture(scope="module")
def result() -> dict:
    return run("batching", size="ci", repeats=2).to_json()  # two repeats: the verdicts' ranges are drawn too


def test_the_sentences_and_the_table_in_chinese(result):
    said = sentences_in(result, "zh_CN")
    assert len(said) == len(result["sentences"]) == 3
    assert said[0].startswith("请求同时到达时，连续批处理用") and "个引擎步" in said[0]
    assert all(not english_words(s) for s in said), [english_words(s) for s in said]
    n = len(result["settings"][0]["per_request"])
    assert f"跑完 {n} 个请求" in said[0]  # this result's numbers in the Chinese sentence
    header, rows = headline_rows(result, "zh_CN")
    assert header[:3] == ["设置", "引擎步", "CPU 时间（秒）"] and rows[0][0] == "静态，同时到达"
    assert sentences_in(result, "en") == result["sentences"]  # English: the sentences the run wrote


def test_the_figures_in_chinese(result):
    figs = figures(result, "zh_CN")
    assert len(figs) == len(figures(result, "en"))
    left = {w for text in figure_texts(figs) for w in english_words(text)}
    assert not left, sorted(left)
    assert figs[0]["layout"]["title"]["text"].startswith("CPU 时间、总完成时间和延迟")


def test_the_html_result_and_its_export_in_chinese(result, tmp_path):
    names = {result["model"], *english_words(result["machine"].get("platform", ""))}  # the machine's own words
    for page in (result_html(result, lang="zh_CN"), to_html(result, "zh_CN")):
        text = visible_text(page)
        assert "静态批处理与连续批处理" in text and "计时：" in text
        assert not english_words(text, names), sorted(set(english_words(text, names)))
    assert '<html lang="zh-CN">' in to_html(result, "zh_CN")
    assert "Static vs continuous batching" in visible_text(to_html(result))  # English as it was
    # the JSON export: the result as the run wrote it, English keys and sentences
    assert json.loads(json.dumps(result))["sentences"] == result["sentences"]


def test_every_experiments_title_columns_and_settings_have_their_chinese():
    untranslated = []
    for exp in experiments():
        names = [exp.title] + [label for _, label in exp.headline]
        try:
            names += [s.label for s in exp.settings("ci")]
        except TypeError:  # settings(size, model): what runs depends on the model
            names += [s.label for s in exp.settings("ci", None)]
        untranslated += [(exp.name, n) for n in names if word("zh_CN", n) == n and n != "float32"]  # (a dtype)
    assert not untranslated, untranslated


def test_the_progress_line_in_chinese():
    """What a run reports as it goes (runner.report's words, with their numbers) on a Chinese tab."""
    job = LabRun("tab", "batching", "Static vs continuous batching")
    job.progress = Progress("batching", "continuous, staggered · repeat 2 of 3", 3, 4, 5, 8,
                            "step 12, 5 of 8 requests done", repeat=1, repeats=3)
    said = progress_html(job, "zh_CN")
    assert "静态批处理与连续批处理 · 第 4 组设置（共 4 组）：" in said and "连续，错开到达 · 第 2 次重复（共 3 次）" in said
    assert "第 12 步，8 个请求中已完成 5 个" in said
    assert "setting 4 of 4:" in progress_html(job) and "step 12, 5 of 8 requests done" in progress_html(job)
