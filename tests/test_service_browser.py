"""The web page in a real browser (Debian's headless Chromium driven by Selenium), as a user works it:
open the page, solve the bundled DeepSeek-V3 problem, read the plan table against `planner solve
--json`, switch to the rack-generation chart, download the vLLM script, and submit a bad field.
The service runs on 127.0.0.1 in a thread of this process. Skips only when Chromium is absent
(`.ci/run` installs it). PLANNER_SCREENSHOT=docs/serve-page.png also saves the README's screenshot."""

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the service's extra (fastapi) is not installed: pip install '.[serve]'")
uvicorn = pytest.importorskip("uvicorn", reason="the service's extra (uvicorn) is not installed: pip install '.[serve]'")
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed: pip install '.[test]'")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    pytest.skip("Chromium is absent (apt-get install -y chromium chromium-driver; .ci/run installs them)", allow_module_level=True)

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

from planner.cli.main import main
from planner.service.app import ServiceSettings, create_app

BUNDLED = "deepseek-v3-gb200-nvl72"
WAIT_S = 60
LLAMA_31_8B_CONFIG = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "vocab_size": 128256, "num_attention_heads": 32,
                      "num_key_value_heads": 8, "intermediate_size": 14336, "max_position_embeddings": 131072}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    config = uvicorn.Config(create_app(ServiceSettings()), host="127.0.0.1", port=port, log_level="warning")
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not instance.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert instance.started, "the service did not start"
    yield f"http://127.0.0.1:{port}"
    instance.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    downloads = tmp_path_factory.mktemp("downloads")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1500"):
        options.add_argument(flag)
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads), "download.prompt_for_download": False})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})  # headless needs it said
    driver.downloads = downloads
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def cli_plan(tmp_path_factory):
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["solve", BUNDLED, "--json", str(path)]) == 0
    return json.loads(path.read_text()), path


def _wait(driver, condition, what: str):
    return WebDriverWait(driver, WAIT_S).until(lambda d: condition(d), message=f"waiting for {what}")


def _money(value: float, digits: int = 4) -> str:
    return f"${value:.{digits}f}"


def test_the_page_solves_compares_downloads_and_refuses(server, browser, cli_plan, capsys):
    plan, plan_path = cli_plan
    browser.get(server + "/")
    _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true", "the page to load")
    browser.find_element(By.ID, f"problem-{BUNDLED}").click()
    browser.find_element(By.ID, "solve").click()
    rows = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#plan-table tbody tr"), "the plan table")
    header = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#plan-table thead th")]
    assert len(rows) == len(plan["deployments"])
    for tr, d in zip(rows, plan["deployments"]):
        cell = dict(zip(header, (td.text for td in tr.find_elements(By.TAG_NAME, "td"))))
        assert (cell["workload"], cell["rack"], cell["role"]) == (d["workload"], d["rack"], d["role"])
        assert cell["layout"].startswith(f"TP{d['tp']} x DPattn{d['dp_attn']} x EP{d['ep']}")
        assert (int(cell["batch"]), int(cell["replicas"]), int(cell["accelerators"])) == (d["batch_per_replica"], d["replicas"], d["accelerators"])
        assert cell["$/M out"] == _money(d["usd_per_million_output_tokens"])
        assert cell["TPOT"] == f"{d['tpot_s'] * 1000:.3g} ms"
        low, high = d["usd_per_million_output_tokens_range"]
        assert cell["$/M out p10-p90"] == f"{_money(low)} - {_money(high)}"
    assert browser.find_elements(By.CSS_SELECTOR, "#explanation li")
    assert f"problem={BUNDLED}" in browser.find_element(By.ID, "share-url").get_attribute("value")
    cells = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#placement svg g"), "the placement picture")
    assert len(cells) == sum(r["accelerators"] for r in plan["racks"].values())
    if os.environ.get("PLANNER_SCREENSHOT"):
        browser.save_screenshot(os.environ["PLANNER_SCREENSHOT"])

    browser.find_element(By.ID, "tab-compare").click()
    racks = browser.find_element(By.ID, "compare-racks")
    racks.clear()
    racks.send_keys("hgx-h200,gb200-nvl72")
    browser.find_element(By.ID, "run-compare").click()
    bars = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#compare-chart svg.bar-chart rect[data-label]"), "the comparison chart")
    assert [b.get_attribute("data-label") for b in bars] == ["hgx-h200 (chat)", "gb200-nvl72 (chat)"]
    table = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in browser.find_elements(By.CSS_SELECTOR, "#compare-table tbody tr")]
    assert table[1][3] == _money(plan["deployments"][0]["usd_per_million_output_tokens"])  # the problem's own rack: the solve's plan

    browser.find_element(By.ID, "tab-downloads").click()
    browser.find_element(By.ID, "download-vllm").click()
    script = browser.downloads / "launch-vllm.sh"
    _wait(browser, lambda d: script.exists() and script.stat().st_size > 0, "the downloaded vLLM script")
    capsys.readouterr()
    assert main(["export", str(plan_path), "--format", "vllm"]) == 0
    assert script.read_text() == capsys.readouterr().out

    browser.find_element(By.ID, "tab-plan").click()
    Select(browser.find_element(By.ID, "qe-rack")).select_by_visible_text("hgx-h200")  # the quick edit writes the document
    osl = browser.find_element(By.ID, "qe-osl")
    osl.clear()
    osl.send_keys("2048\t")
    document = json.loads(browser.find_element(By.ID, "problem-doc").get_attribute("value"))
    assert (document["cluster"]["racks"][0]["type"], document["workloads"][0]["output_tokens"]) == ("hgx-h200", 2048)
    assert "#doc=" in browser.find_element(By.ID, "share-url").get_attribute("value")  # an edited question travels in the link
    browser.find_element(By.CSS_SELECTOR, "#paste-model summary").click()
    browser.find_element(By.ID, "hf-config").send_keys(json.dumps(LLAMA_31_8B_CONFIG))
    browser.find_element(By.ID, "use-config").click()
    _wait(browser, lambda d: "inline" in d.find_element(By.ID, "problem-doc").get_attribute("value"), "the pasted model in the document")
    document = json.loads(browser.find_element(By.ID, "problem-doc").get_attribute("value"))
    assert (document["model"]["inline"]["id"], document["model"]["inline"]["n_layers"]) == ("my-model", 32)
    assert browser.find_element(By.ID, "qe-model").get_attribute("disabled")  # no longer a catalog id
    browser.execute_script("const t = document.getElementById('problem-doc'); const doc = JSON.parse(t.value);"
                           "doc.workloads[0].input_tokens = 0; t.value = JSON.stringify(doc, null, 2);"
                           "t.dispatchEvent(new Event('input'));")
    browser.find_element(By.ID, "solve").click()
    error = _wait(browser, lambda d: d.find_element(By.ID, "error") if d.find_element(By.ID, "error").is_displayed() else None, "the message")
    assert "workloads[0].input_tokens" in error.text and "fix:" in error.text and "Traceback" not in error.text


def test_the_sweeps_panel_runs_a_sweep_to_the_cli_table(server, browser, tmp_path):
    import csv

    import yaml

    spec = {"name": "gens", "base": "llama-3.1-70b-hgx-h100", "racks": ["hgx-h100", "hgx-b200"], "time_limit_s": 5}
    (tmp_path / "gens.yaml").write_text(yaml.safe_dump(spec))
    assert main(["sweep", str(tmp_path / "gens.yaml"), "--out", str(tmp_path / "out")]) == 0
    with open(tmp_path / "out" / "gens.csv") as f:
        cli = list(csv.DictReader(f))
    browser.get(server + "/")
    _wait(browser, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "true", "the page to load")
    browser.find_element(By.ID, "problem-llama-3.1-70b-hgx-h100").click()
    browser.find_element(By.ID, "tab-sweeps").click()
    assert json.loads(browser.find_element(By.ID, "sweep-doc").get_attribute("value"))["base"] == "llama-3.1-70b-hgx-h100"
    browser.execute_script("document.getElementById('sweep-doc').value = arguments[0];", json.dumps(spec))
    browser.find_element(By.ID, "run-sweep").click()
    rows = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#sweep-table tbody tr"), "the sweep table")
    header = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#sweep-table thead th")]
    cells = [dict(zip(header, (td.text for td in tr.find_elements(By.TAG_NAME, "td")))) for tr in rows]
    assert [(c["id"], c["racks"], c["$/M out"]) for c in cells] == [
        (r["id"], r["racks"], _money(float(r["usd_per_million_output_tokens"]))) for r in cli]
    assert "done: 2 of 2 points" in browser.find_element(By.ID, "sweep-progress").text
    assert browser.find_elements(By.CSS_SELECTOR, "#sweep-summary li")
