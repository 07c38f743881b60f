"""Documents in the chat: files the tests make (fixtures/documents_files.py: a 3-page PDF and a .docx with a known fact,
a 500-page text with one needle passage, a scanned-only PDF, an encrypted one, a broken one, a .docx zip bomb) read
by pypdf and python-docx, put in the prompt whole where they fit and searched (SQLite FTS5, BM25) where they do not,
through the chat tab's handlers on the demo model; the sources under the answer; each bad file its sentence; a
saved conversation with a document reopened without reading it again. tests/test_browser.py attaches one in
Chromium."""

import asyncio
import base64
import json
import sqlite3
from pathlib import Path

import pytest

from fixtures.app_server import submit
from fixtures.documents_files import long_text, write_docx, write_docx_bomb, write_encrypted_pdf, write_pdf
from local_chat.defaults import DEMO_MODEL
from local_chat.documents import Shelf, extract
from local_chat.documents.context import passages_of
from local_chat.errors import UserError
from local_chat.history import Store
from local_chat.model.meta import MetaModel
from local_chat.ui import documents as page_documents
from local_chat.ui.chat import Cancels
from local_chat.ui.chat_tab import ChatTab
from local_chat.ui.history import SavedChats
from local_chat.ui.turns import kind_of

pytestmark = pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="the demo model is not built")
FACT = "The launch code is ZEBRA-42."
NEEDLE = "The needle: the treasure lies under the old oak by the mill."
BROWSER = "d" * 40


@pytest.fixture(scope="module")
def demo():
    return MetaModel.from_pretrained(str(DEMO_MODEL))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("documents")
    big = folder / "atlas.txt"
    big.write_text(long_text(500, NEEDLE, 321))
    return {
        "pdf": write_pdf(folder / "report.pdf", [["Quarterly report.", "Nothing here."], [FACT], ["The end."]]),
        "docx": write_docx(folder / "notes.docx", ["Meeting notes.", "The budget is 1.5 million euros."]),
        "long": big,
        "scan": write_pdf(folder / "scan.pdf", [[], []]),
        "encrypted": write_encrypted_pdf(folder / "locked.pdf"),
        "broken": _written(folder / "broken.pdf", b"%PDF-1.4\nthis is not a PDF body"),
        "bomb": write_docx_bomb(folder / "bomb.docx", 30),
        "unknown": _written(folder / "program.exe", b"MZ\x90\x00"),
    }


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_each_kind_is_read_page_by_page(files):
    pdf = extract(files["pdf"], 20)
    assert pdf.paged and pdf.pages[1] == FACT and len(pdf.pages) == 3
    assert extract(files["docx"], 20).pages == ("Meeting notes.\nThe budget is 1.5 million euros.",)
    assert len(extract(files["long"], 20).pages) >= 500  # cut about a printed page apart


@pytest.mark.parametrize(
    "name, sentence",
    [
        ("scan", "no text found (a scan?); attach its pages as images instead"),
        ("encrypted", "is encrypted; remove its password"),
        ("broken", "cannot be read as a PDF"),
        ("bomb", "unzips to 30 MB, far more than a document holds"),
    ],
)
def test_a_bad_document_is_one_sentence(files, name, sentence):
    with pytest.raises(UserError, match=sentence.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        extract(files[name], 0.2)


def test_a_document_over_the_upload_limit_is_told(files):
    with pytest.raises(UserError, match=r"over the 0.001 MB limit \(--max_upload_mb\)"):
        extract(files["long"], 0.001)


def test_the_needle_is_the_first_passage_bm25_finds_and_a_document_is_indexed_once(files):
    shelf = Shelf()
    atlas = extract(files["long"], 20)
    shelf.put(atlas)
    shelf.put(atlas)
    found = shelf.search([atlas.sha256], "Where does the treasure lie?")
    assert NEEDLE in found[0].text
    count = shelf._db.execute("SELECT count(*) FROM passages WHERE sha256 = ?", (atlas.sha256,)).fetchone()[0]
    assert count == len(passages_of(atlas))


def page(demo, tmp_path, **kwargs):
    store = Store(tmp_path / "conversations.db")
    return ChatTab(demo.engine, Cancels(), "default", "padded_resize", SavedChats(store), **kwargs), store


def test_a_pdf_that_fits_goes_in_whole_and_its_sources_show_under_the_answer(demo, files, tmp_path, monkeypatch):
    tab, store = page(demo, tmp_path)
    box = {"text": "What is the launch code?", "files": [str(files["pdf"])]}
    history, _, prompt, conversation, _ = submit(tab, box, browser_id=BROWSER)
    assert '<document source="1" name="report.pdf">' in prompt and f"[page 2]\n{FACT}" in prompt
    assert "cite them by number, as [1] or [2]" in prompt and prompt.index(FACT) < prompt.index("launch code?")
    question, sources = history[0], next(e for e in history if kind_of(e) == "sources")
    assert question["documents"] == [{"sha256": extract(files["pdf"], 20).sha256, "name": "report.pdf"}]
    assert question["content"].startswith("Attached: report.pdf (3 pages)")
    assert store.get("browser:" + BROWSER, conversation).title == "What is the launch code?"
    assert sources["metadata"]["title"] == "Sources" and "**[1] report.pdf**, whole" in sources["content"]
    assert [kind_of(e) for e in history][-2:] == ["sources", "stats"]

    def read_again(*args):
        raise AssertionError("the document was read again")

    monkeypatch.setattr(page_documents, "extract_elsewhere", read_again)
    owner = "browser:" + BROWSER
    reopened = tab.saved.shown(owner, conversation, store.get(owner, conversation).messages)
    first_prompt = store.get(owner, conversation).options["prompt"]
    history, _, prompt, _, _ = submit(tab, "And the report's last page?", reopened, conversation=conversation,
                                      browser_id=BROWSER)  # fmt: skip
    assert "[page 3]\nThe end." in prompt and prompt.count("<document ") == 1
    assert prompt.startswith(first_prompt)  # before its own question: the conversation's start (and cache) kept
    store.close()


def test_a_word_document_goes_in_the_same_way(demo, files, tmp_path):
    tab, store = page(demo, tmp_path)
    _, _, prompt, _, _ = submit(tab, {"text": "What is the budget?", "files": [str(files["docx"])]}, browser_id=BROWSER)
    assert '<document source="1" name="notes.docx">\n[part 1]\nMeeting notes.\nThe budget is 1.5 million' in prompt
    store.close()


def test_a_long_document_is_searched_and_the_needle_passage_goes_in(demo, files, tmp_path):
    tab, store = page(demo, tmp_path)
    box = {"text": "Where does the treasure lie?", "files": [str(files["long"])]}
    history, _, prompt, _, _ = submit(tab, box, browser_id=BROWSER, max_gen_len=64)
    sources = next(e for e in history if kind_of(e) == "sources")
    assert NEEDLE in prompt and "[part " in prompt and len(prompt) < 2048 * 4
    assert sources["sources"][0]["whole"] is False and NEEDLE in sources["content"]
    assert "atlas.txt did not fit whole beside the conversation" in sources["content"]
    store.close()


def test_a_bad_file_is_taken_out_with_its_sentence_and_the_text_stays(demo, files, tmp_path):
    tab, store = page(demo, tmp_path)
    good, bad = str(files["pdf"]), str(files["encrypted"])
    with pytest.warns(UserWarning, match="Taken out of the message") as warned:
        history, box, *_ = submit(tab, {"text": "Summarise these.", "files": [good, bad]}, browser_id=BROWSER)
    assert "locked.pdf is encrypted" in str(warned[0].message)
    assert box == {"text": "Summarise these.", "files": [good]}  # only the bad one is taken out
    history, *_ = submit(tab, box, browser_id=BROWSER)
    assert history[0]["documents"][0]["name"] == "report.pdf"
    store.close()


def test_a_version_5_database_is_upgraded_and_the_old_app_refuses_the_new_one(tmp_path, monkeypatch):
    from local_chat.history import store as store_module

    path = tmp_path / "conversations.db"
    with sqlite3.connect(path) as db:
        db.executescript((Path(__file__).resolve().parent / "data" / "conversations-v5.sql").read_text())
    store = Store(path)
    found = store.get("browser:" + "e" * 32, "conversation-five")
    assert found.messages[1]["approval"] == "done"  # schema 5's tool calls read as they were
    shelf = Shelf(str(path))
    assert shelf.search(["none"], "anything") == []  # the index's tables are there
    shelf.close(), store.close()
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", 5)
    with pytest.raises(UserError, match="was written by a newer version of this app"):
        Store(path)


def file_part(path: Path) -> dict:
    data = base64.b64encode(path.read_bytes()).decode()
    return {
        "type": "file",
        "file": {"file_data": f"data:application/octet-stream;base64,{data}", "filename": path.name},
    }


def test_v1_takes_a_file_part_the_same_way_and_refuses_a_bad_one_in_a_sentence(demo, files):
    from openai import BadRequestError, OpenAI

    from fixtures.app_server import serve
    from local_chat.api.documents import with_file_parts
    from local_chat.engine import ChatOptions, Request
    from local_chat.engine.chats import ChatEngine

    question = {"type": "text", "text": "What is the launch code?"}
    request = Request(messages=[{"role": "user", "content": [file_part(files["pdf"]), question]}],
                      chat=ChatOptions(answer_tokens=64))  # fmt: skip
    engine = ChatEngine(demo.engine, "default")
    messages, documents = asyncio.run(with_file_parts(engine, request, Shelf(), 20))
    assert f"[page 2]\n{FACT}" in messages[0]["content"][-1]["text"] and "documents" not in messages[0]
    assert documents == 1  # the web's sources are numbered after it
    with serve(demo) as (url, _):
        client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        plain = client.chat.completions.create(model="demo", messages=[{"role": "user", "content": [question]}],
                                               max_tokens=8, temperature=0)  # fmt: skip
        with_pdf = client.chat.completions.create(
            model="demo", messages=[{"role": "user", "content": [file_part(files["pdf"]), question]}], max_tokens=8,
            temperature=0,
        )  # fmt: skip
        with pytest.raises(BadRequestError) as refused:
            client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": [file_part(files["encrypted"]), question]}]
            )
    assert with_pdf.usage.prompt_tokens > plain.usage.prompt_tokens + 20
    assert "locked.pdf is encrypted" in str(refused.value)


def test_a_conversation_with_a_document_exports_and_imports_with_it(demo, files, tmp_path):
    tab, store = page(demo, tmp_path)
    owner = "browser:" + BROWSER
    box = {"text": "What is the launch code?", "files": [str(files["pdf"])]}
    _, _, _, conversation, _ = submit(tab, box, browser_id=BROWSER)
    exported = tab.saved.exports.export(owner, conversation, "json")
    question = json.loads(Path(exported).read_text())["messages"][0]
    assert question["documents"] == [{"name": "report.pdf", "paged": True, "pages": ["Quarterly report.\nNothing here.",
                                                                                     FACT, "The end."]}]  # fmt: skip
    other, other_store = page(demo, tmp_path / "elsewhere")  # another app: its own database
    imported = other.saved.exports.import_file(owner, exported)
    reopened = other.saved.shown(owner, imported, other_store.get(owner, imported).messages)
    _, _, prompt, _, _ = submit(other, "Again: the launch code?", reopened, conversation=imported, browser_id=BROWSER)
    assert f"[page 2]\n{FACT}" in prompt
    store.close(), other_store.close()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """(an embedding model, a cross-encoder): tiny random BERTs of the real classes with a WordPiece tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("bert")
    words = sorted({w.lower() for w in (long_text(3, NEEDLE, 2) + " where does lie").replace(".", " ").split()})
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    config = BertConfig(vocab_size=5 + len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512)  # fmt: skip
    made = []
    for name, model in (("embedder", BertModel(config)), ("reranker", BertForSequenceClassification(
            BertConfig(**config.to_dict(), num_labels=1)))):  # fmt: skip
        model.save_pretrained(folder / name)
        BertTokenizerFast(vocab_file=str(vocab)).save_pretrained(folder / name)
        made.append(str(folder / name))
    return made


def test_an_embedding_model_and_a_reranker_help_the_search(files, tiny_bert, monkeypatch):
    from local_chat.documents.vectors import Embedder, Reranker

    embedder, reranker = Embedder(tiny_bert[0]), Reranker(tiny_bert[1])
    scored = []
    scores = reranker.scores
    monkeypatch.setattr(reranker, "scores", lambda q, texts: scored.append(len(texts)) or scores(q, texts))
    shelf = Shelf(":memory:", embedder, reranker)
    atlas = extract(files["long"], 20)
    shelf.put(atlas)
    found = shelf.ranked([atlas.sha256], "Where does the treasure lie?")
    vectors = shelf._db.execute("SELECT count(*) FROM passage_vectors WHERE model = 'embedder'").fetchone()[0]
    assert vectors == len(passages_of(atlas))  # every passage embedded, once
    assert scored == [20] and NEEDLE in " ".join(p.text for p in found[:20])  # BM25's best stays among the first


def test_a_retrieval_model_folder_without_a_config_is_refused_in_one_sentence(tmp_path):
    from local_chat.launchers.flags import parser
    from local_chat.launchers.loading import check_serving_flags

    args = parser("x").parse_args(["--embedding_model", str(tmp_path)])
    with pytest.raises(UserError, match="--embedding_model .* has no config.json"):
        check_serving_flags(args)


def test_mojibake_and_ligatures_are_mended(tmp_path):
    broken = tmp_path / "menu.txt"
    broken.write_text("CafÃ© naÃ¯ve, the ﬁrst “best” dish.")
    assert extract(broken, 1).pages == ("Café naïve, the first “best” dish.",)


def test_a_pdf_can_go_to_a_model_that_sees_images_as_pictures_of_its_pages(demo, files, tmp_path):
    tab, store = page(demo, tmp_path)
    box = {"text": "What do these pages show?", "files": [str(files["pdf"])]}
    history, _, prompt, _, _ = submit(tab, box, browser_id=BROWSER, pdf_pictures=True)
    question = history[0]
    assert len(question["images"]) == 3 and "documents" not in question and "<document" not in prompt
    store.close()


def test_a_document_larger_than_any_room_says_so(files):
    from local_chat.documents import document_context

    shelf = Shelf()
    atlas = extract(files["long"], 20)
    shelf.put(atlas)
    context = document_context([atlas], "Where does the treasure lie?", 10, len, shelf)
    assert context.text == "" and context.sources == []
    assert context.note == ("atlas.txt did not fit beside the conversation (10 tokens left), so none of it went in; "
                            "start a new chat with it, or ask with a model of a longer context.")  # fmt: skip


def test_a_question_with_an_image_and_a_document_reopens_listing_both(demo, files, tmp_path):
    from PIL import Image

    tab, store = page(demo, tmp_path)
    picture = tmp_path / "red.png"
    Image.new("RGB", (32, 32), (255, 0, 0)).save(picture)
    box = {"text": "Compare them.", "files": [str(picture), str(files["pdf"])]}
    history, _, _, conversation, _ = submit(tab, box, browser_id=BROWSER)
    owner = "browser:" + BROWSER
    reopened = tab.saved.shown(owner, conversation, store.get(owner, conversation).messages)
    assert reopened[0]["content"] == history[0]["content"] and "Attached: report.pdf (3 pages)" in history[0]["content"]
    assert reopened[0]["documents"] == history[0]["documents"] and len(reopened[0]["images"]) == 1
    store.close()
