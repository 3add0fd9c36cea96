"""Migration from the AWS notebooks: `--io-names` renames the ensemble's public tensors, so a tarball answers the
notebooks' client code unchanged (texts in `INPUT0`, embeddings out of `OUTPUT0`; images in `INPUT`, scores out of
`OUTPUT`), through the local MME and an unmodified boto3 client, in JSON and in binary+json."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.mme_support import aws_env, local_mme, models_folder, runtime_for, tiny_model, tiny_reference  # noqa: F401
from tritonpack.builder import BuildRequest, build
from tritonpack.contracts import IoNames
from tritonpack.spec import parse_config

pytestmark = pytest.mark.server
TEXTS = ["The notebooks send INPUT0.", "and read OUTPUT0"]
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="


@pytest.fixture(scope="module")
def notebook_endpoint(tiny_model, test_dist, tmp_path_factory, local_mme):  # noqa: F811
    text = build(BuildRequest("bert", "portable", model=str(tiny_model), io_names=IoNames("INPUT0", "OUTPUT0"),
                              env=False, dist=_dist(test_dist, tmp_path_factory, "text")))
    image = build(BuildRequest("resnet_trt", "portable", io_names=IoNames("INPUT", "OUTPUT"), env=False,
                               dist=_dist(test_dist, tmp_path_factory, "image")))
    folder = models_folder(tmp_path_factory.mktemp("notebook-models"),
                           {"bert.tar.gz": text.tarball, "resnet.tar.gz": image.tarball})
    return text, image, runtime_for(local_mme(folder, max_models=2))


def _dist(test_dist, tmp_path_factory, name):
    dist = tmp_path_factory.mktemp(f"io-names-{name}")
    (dist / "cache").symlink_to(test_dist / "cache")
    return dist


def test_io_names_rename_only_the_ensembles_public_tensors_when_built(notebook_endpoint):
    text, _, _ = notebook_endpoint
    ensemble = parse_config((text.repository / "bert" / "config.pbtxt").read_text())
    assert ([t.name for t in ensemble.input], [t.name for t in ensemble.output]) == (["INPUT0"], ["OUTPUT0"])
    encoder = parse_config((text.repository / "bert_encoder" / "config.pbtxt").read_text())
    assert [t.name for t in encoder.input] == ["TEXT"]  # the reusable step keeps its own names
    assert dict(ensemble.ensemble_scheduling.step[0].input_map) == {"TEXT": "INPUT0"}


def test_notebook_json_client_gets_embeddings_from_output0_when_it_sends_input0(notebook_endpoint, tiny_reference):  # noqa: F811
    # the notebooks' JSON client, as written there: a KServe v2 JSON body sent as application/octet-stream
    _, _, client = notebook_endpoint
    payload = {"inputs": [{"name": "INPUT0", "shape": [len(TEXTS), 1], "datatype": "BYTES", "data": TEXTS}]}
    response = client.invoke_endpoint(EndpointName="local", ContentType="application/octet-stream",
                                      Body=json.dumps(payload), TargetModel="bert.tar.gz")
    output = json.loads(response["Body"].read().decode("utf8"))["outputs"][0]
    assert output["name"] == "OUTPUT0"
    got = np.array(output["data"], dtype=np.float32).reshape(output["shape"])
    np.testing.assert_allclose(got, tiny_reference(TEXTS), atol=2e-3)


def test_notebook_binary_client_gets_embeddings_from_output0_when_it_sends_input0(notebook_endpoint, tiny_reference):  # noqa: F811
    import tritonclient.http as httpclient

    _, _, client = notebook_endpoint
    inputs = [httpclient.InferInput("INPUT0", [len(TEXTS), 1], "BYTES")]
    inputs[0].set_data_from_numpy(np.array([[t] for t in TEXTS], dtype=object), binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    response = client.invoke_endpoint(EndpointName="local", ContentType=f"{BINARY_JSON}{header_length}", Body=body,
                                      TargetModel="bert.tar.gz")
    header_length = int(response["ContentType"][len(BINARY_JSON):])
    result = httpclient.InferenceServerClient.parse_response_body(response["Body"].read(), header_length=header_length)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), tiny_reference(TEXTS), atol=2e-3)


@pytest.mark.parametrize("fmt", ["json", "binary"])
def test_notebook_image_client_gets_scores_from_output_when_it_sends_input(notebook_endpoint, fmt):
    import tritonclient.http as httpclient

    from tests.reliability.hostile import sample_jpeg
    from tests.test_image_served import MAX_REL_DIFF, DirectRun, max_rel_diff

    _, image, client = notebook_endpoint
    jpeg_bytes = sample_jpeg((96, 80))
    jpeg = np.frombuffer(jpeg_bytes, dtype=np.uint8)[None]
    inputs = [httpclient.InferInput("INPUT", list(jpeg.shape), "UINT8")]
    inputs[0].set_data_from_numpy(jpeg, binary_data=fmt == "binary")
    outputs = [httpclient.InferRequestedOutput("OUTPUT", binary_data=fmt == "binary")]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    content_type = f"{BINARY_JSON}{header_length}" if header_length else "application/json"
    response = client.invoke_endpoint(EndpointName="local", ContentType=content_type, Body=body,
                                      TargetModel="resnet.tar.gz")
    length = response["ContentType"][len(BINARY_JSON):] if response["ContentType"].startswith(BINARY_JSON) else None
    result = httpclient.InferenceServerClient.parse_response_body(response["Body"].read(),
                                                                  header_length=int(length) if length else None)
    scores = result.as_numpy("OUTPUT")
    assert scores.shape == (1, 1000)
    expected = DirectRun(image.repository, "resnet_trt").scores([jpeg_bytes])  # the repository's files in-process
    assert max_rel_diff(scores, expected) <= MAX_REL_DIFF
    ensemble = parse_config((image.repository / "resnet_trt" / "config.pbtxt").read_text())
    assert ensemble.output[0].name == "OUTPUT" and ensemble.output[0].label_filename == "labels.txt"


def test_infer_embeds_through_renamed_tensors_served_directly_and_through_the_mme(notebook_endpoint, tiny_reference,  # noqa: F811
                                                                                  capsys):
    """`tritonpack infer` sent TEXT and read EMBEDDING whatever the model's names: a repository built with --io-names
    answered "unexpected inference output 'EMBEDDING'". Served directly it reads the names from the server; through
    an MME (whose API has no metadata) it takes --io-names."""
    from tritonpack.cli import main
    from tritonpack.server import TritonServer

    text, _, client = notebook_endpoint
    with TritonServer(text.repository) as server:
        assert main(["infer", *TEXTS, "--url", server.url, "--json"]) == 0
        np.testing.assert_allclose(json.loads(capsys.readouterr().out)["embeddings"], tiny_reference(TEXTS), atol=2e-3)
    assert main(["infer", *TEXTS, "--mme", client.meta.endpoint_url, "--target-model", "bert.tar.gz", "--io-names",
                 "INPUT0:OUTPUT0", "--json"]) == 0
    np.testing.assert_allclose(json.loads(capsys.readouterr().out)["embeddings"], tiny_reference(TEXTS), atol=2e-3)
    # without --io-names, Triton's refusal and what to pass, in one line (it said only "unexpected inference output")
    assert main(["infer", *TEXTS, "--mme", client.meta.endpoint_url, "--target-model", "bert.tar.gz"]) == 1
    assert capsys.readouterr().err == (
        "error: invoke bert.tar.gz: refused: ModelError: Received client error (400) from model 'bert.tar.gz' with "
        "message \"unexpected inference output 'EMBEDDING' for model 'bert.tar.gz'\"; the model has no output "
        "'EMBEDDING': it was built with other names (--io-names): pass them as --io-names INPUT:OUTPUT, e.g. "
        "--io-names INPUT0:OUTPUT0\n")
