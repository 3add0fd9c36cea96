"""`tritonpack upload` and `deploy` against moto's server mode on loopback (real HTTP S3/SageMaker APIs)."""

from __future__ import annotations

import io
import os

import boto3
import pytest

from tests import mme_support
from tritonpack import aws, cli
from tritonpack.containers import CONTAINER_ENVIRONMENT, serve_flags
from tritonpack.errors import UserError

aws_env, moto_server = mme_support.aws_env, mme_support.moto_server  # shared session fixtures

ROLE = "arn:aws:iam::123456789012:role/sagemaker-execution"


@pytest.fixture
def s3(moto_server):
    client = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    return client


@pytest.fixture
def bucket(s3, request):
    name = request.node.name.lower().replace("_", "-")[:50].strip("-")
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture
def tarball(tmp_path):
    path = tmp_path / "bert-portable.tar.gz"
    path.write_bytes(os.urandom(3000))
    return path


def keys(s3, bucket: str, prefix: str = "") -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def test_upload_names_copies_stem_index_when_copies_given(moto_server, s3, bucket, tarball, capsys):
    code = cli.main(["upload", str(tarball), f"s3://{bucket}/mme/", "--copies", "12", "--endpoint-url", moto_server])
    assert code == 0
    assert keys(s3, bucket) == sorted(f"mme/bert-portable-{i}.tar.gz" for i in range(12))
    body = s3.get_object(Bucket=bucket, Key="mme/bert-portable-11.tar.gz")["Body"].read()
    assert body == tarball.read_bytes()
    err = capsys.readouterr().err
    assert "100%" in err and "12/12 objects" in err and "uploaded 12 objects" in err


def test_upload_keeps_names_when_one_copy_of_several_tarballs(moto_server, s3, bucket, tmp_path):
    paths = []
    for name in ("a.tar.gz", "b.tar.gz"):
        paths.append(tmp_path / name)
        paths[-1].write_bytes(name.encode() * 10)
    aws.upload(paths, f"s3://{bucket}", endpoint_url=moto_server, progress=False)
    assert keys(s3, bucket) == ["a.tar.gz", "b.tar.gz"]


def test_upload_goes_multipart_when_tarball_is_above_chunk_size(moto_server, s3, bucket, tmp_path):
    big = tmp_path / "big.tar.gz"
    big.write_bytes(os.urandom(11 * aws.MIB))
    result = aws.upload([big], f"s3://{bucket}/p", copies=2, endpoint_url=moto_server, chunk_bytes=5 * aws.MIB,
                        progress=False)
    assert result.urls == [f"s3://{bucket}/p/big-0.tar.gz", f"s3://{bucket}/p/big-1.tar.gz"]
    head = s3.head_object(Bucket=bucket, Key="p/big-0.tar.gz")
    assert head["ContentLength"] == 11 * aws.MIB
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]  # three parts
    assert s3.get_object(Bucket=bucket, Key="p/big-1.tar.gz")["Body"].read() == big.read_bytes()


def test_upload_says_in_one_line_what_s3_answered_when_the_bucket_does_not_exist(moto_server, tarball, capsys):
    # boto3's transfer wraps S3's answer in S3UploadFailedError, which was a traceback
    code = cli.main(["upload", str(tarball), "s3://no-such-bucket/mme/", "--endpoint-url", moto_server, "--quiet"])
    assert code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: upload: ") and "NoSuchBucket" in line


def test_upload_refuses_to_replace_what_an_endpoint_may_have_loaded_unless_told(moto_server, s3, bucket, tarball,
                                                                                 capsys):
    """AWS: an MME instance that loaded an object keeps serving its old bytes under that name; re-uploading a
    rebuilt tarball over its copies gave instances that answer with different models."""
    upload = ["upload", str(tarball), f"s3://{bucket}/live/", "--copies", "3", "--endpoint-url", moto_server,
              "--quiet"]
    assert cli.main(upload) == 0
    first = s3.get_object(Bucket=bucket, Key="live/bert-portable-2.tar.gz")["Body"].read()
    tarball.write_bytes(os.urandom(3000))  # rebuilt
    assert cli.main(upload) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: s3://{bucket}/live/bert-portable-0.tar.gz (and 2 more) exists: an endpoint may have loaded it, and "
        f"would go on serving the old bytes under that name; upload under a new file name or prefix, or pass "
        f"--overwrite")
    assert s3.get_object(Bucket=bucket, Key="live/bert-portable-2.tar.gz")["Body"].read() == first
    assert cli.main(upload + ["--overwrite"]) == 0
    assert s3.get_object(Bucket=bucket, Key="live/bert-portable-2.tar.gz")["Body"].read() == tarball.read_bytes()


def test_upload_refuses_two_tarballs_that_would_land_on_one_key(moto_server, s3, bucket, tarball, tmp_path, capsys):
    """The second replaced the first, and the count said two objects."""
    other = tmp_path / "b" / tarball.name
    other.parent.mkdir()
    other.write_bytes(b"B" * 100)
    assert cli.main(["upload", str(tarball), str(other), f"s3://{bucket}/mme/", "--endpoint-url", moto_server]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {tarball} and {other} would both be uploaded as "
                                               f"s3://{bucket}/mme/bert-portable.tar.gz: give them different file "
                                               f"names")
    assert keys(s3, bucket) == []


@pytest.mark.parametrize("option", ["--copies", "--threads"])
def test_upload_refuses_a_count_below_one_in_one_line(tarball, capsys, option):
    assert cli.main(["upload", str(tarball), "s3://bucket/mme/", option, "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --copies and --threads must be at least 1, got " + \
        ("0 and 8" if option == "--copies" else "1 and 0")


def test_upload_raises_when_destination_is_not_s3(tarball):
    with pytest.raises(UserError, match="s3://bucket/prefix"):
        aws.upload([tarball], "bucket/prefix", progress=False)


def test_triton_image_uri_uses_region_account_when_region_is_published():
    assert aws.triton_image_uri("us-east-1", "24.09") == \
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/sagemaker-tritonserver:24.09-py3"
    assert aws.triton_image_uri("cn-north-1", "24.05").startswith("727897471807.dkr.ecr.cn-north-1.amazonaws.com.cn/")
    with pytest.raises(UserError, match="no SageMaker Triton image"):
        aws.triton_image_uri("mars-east-1")


def deploy_args(name: str, *extra: str) -> list[str]:
    return ["deploy", "--name", name, "--model-data-url", "s3://models/mme/", "--role", ROLE, "--region",
            "us-east-1", *extra]


def test_deploy_creates_multimodel_endpoint_and_scaling_when_run_against_moto(moto_server, capsys):
    # moto validates instance types against an older list than SageMaker has: ml.g4dn is in both.
    code = cli.main(deploy_args("mme-ep", "--max-instances", "4", "--instance-type", "ml.g4dn.xlarge",
                                "--endpoint-url", moto_server))
    assert code == 0
    out = capsys.readouterr().out
    sm = boto3.client("sagemaker", endpoint_url=moto_server, region_name="us-east-1")
    model = sm.describe_model(ModelName="mme-ep-model")
    container = model["PrimaryContainer"]
    assert container["Mode"] == "MultiModel" and container["ModelDataUrl"] == "s3://models/mme/"
    assert container["Image"] == aws.triton_image_uri("us-east-1")
    config = sm.describe_endpoint_config(EndpointConfigName="mme-ep-config")
    assert config["ProductionVariants"][0]["ModelName"] == "mme-ep-model"
    assert sm.describe_endpoint(EndpointName="mme-ep")["EndpointConfigName"] == "mme-ep-config"
    scaling = boto3.client("application-autoscaling", endpoint_url=moto_server, region_name="us-east-1")
    (policy,) = scaling.describe_scaling_policies(ServiceNamespace="sagemaker")["ScalingPolicies"]
    tracking = policy["TargetTrackingScalingPolicyConfiguration"]
    assert policy["ResourceId"] == "endpoint/mme-ep/variant/AllTraffic"
    assert tracking["TargetValue"] == 60.0
    assert tracking["CustomizedMetricSpecification"]["MetricName"] == "GPUUtilization"
    (target,) = scaling.describe_scalable_targets(ServiceNamespace="sagemaker")["ScalableTargets"]
    assert (target["MinCapacity"], target["MaxCapacity"]) == (1, 4)
    for line in ("create_model: arn:", "create_endpoint_config: arn:", "create_endpoint: arn:",
                 "sagemaker: waiting until {'EndpointName': 'mme-ep'} is endpoint_in_service (minutes)",
                 "put_scaling_policy"):
        assert line in out


def test_deploy_undoes_what_it_created_when_a_later_call_fails_so_that_it_can_run_again(moto_server, capsys):
    """A refused endpoint config left the model behind, and running the deploy again met a model that exists."""
    sm = boto3.client("sagemaker", endpoint_url=moto_server, region_name="us-east-1")
    assert cli.main(deploy_args("undo-ep", "--instance-type", "ml.not-a-type", "--endpoint-url", moto_server)) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: sagemaker.create_endpoint_config: refused: ") and \
        line.endswith("; undone: delete_model undo-ep-model"), line
    assert not [m for m in sm.list_models()["Models"] if m["ModelName"] == "undo-ep-model"]
    assert cli.main(deploy_args("undo-ep", "--instance-type", "ml.g4dn.xlarge", "--endpoint-url", moto_server)) == 0
    assert sm.describe_endpoint(EndpointName="undo-ep")["EndpointConfigName"] == "undo-ep-config"


def test_deploy_says_why_the_endpoint_failed_before_it_deletes_it():
    """The waiter's error said only that the status matched "Failed"; undoing then deleted the endpoint, and with it
    the FailureReason describe-endpoint would have shown. moto's endpoints go InService at once (it cannot fail one):
    botocore's Stubber gives the Failed answer AWS gives."""
    from datetime import datetime

    from botocore.stub import Stubber

    spec = aws.DeploySpec(name="ep", model_data_url="s3://b/p/", role_arn=ROLE, region="us-east-1",
                          instance_type="ml.g5.xlarge", max_instances=2)  # scaling waits for the endpoint
    sm = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    stubber = Stubber(sm)
    for operation, arn in (("create_model", "ModelArn"), ("create_endpoint_config", "EndpointConfigArn"),
                           ("create_endpoint", "EndpointArn")):
        stubber.add_response(operation, {arn: f"arn:aws:sagemaker:us-east-1:1:{operation}/ep"})
    reason = "The primary container for production variant AllTraffic did not pass the ping health check."
    stubber.add_response("describe_endpoint", {
        "EndpointName": "ep", "EndpointArn": "arn:aws:sagemaker:us-east-1:1:endpoint/ep", "EndpointStatus": "Failed",
        "FailureReason": reason, "CreationTime": datetime.now(), "LastModifiedTime": datetime.now()})
    for operation in ("delete_endpoint", "delete_endpoint_config", "delete_model"):
        stubber.add_response(operation, {})
    with stubber, pytest.raises(UserError) as error:
        aws.run_plan(aws.deploy_plan(spec), "us-east-1", client_factory=lambda service, **_: sm, out=io.StringIO())
    said = str(error.value)
    assert said.startswith("sagemaker.wait_until_endpoint_in_service: ") and "\n" not in said
    assert f"; FailureReason: {reason}; undone: delete_endpoint ep, " in said
    stubber.assert_no_pending_responses()


@pytest.mark.parametrize(("instance_type", "metric", "target"), [
    ("ml.g4dn.xlarge", "GPUUtilization", 60.0),
    ("ml.g5.12xlarge", "GPUUtilization", 240.0),  # GPUUtilization sums 4 GPUs: 60 % each
    ("ml.c5.2xlarge", "SageMakerVariantInvocationsPerInstance", 1000.0),  # no GPU: no GPUUtilization either
])
def test_deploy_plan_tracks_gpu_utilization_per_gpu_and_invocations_where_there_is_no_gpu(instance_type, metric,
                                                                                           target):
    spec = aws.DeploySpec("x", "s3://b/p/", ROLE, "us-east-1", instance_type=instance_type, max_instances=2)
    tracking = aws.deploy_plan(spec)[-1].params["TargetTrackingScalingPolicyConfiguration"]
    assert metric in str(tracking) and tracking["TargetValue"] == target


@pytest.mark.parametrize(("extra", "said"), [
    (["--scaling-metric", "gpu", "--instance-type", "ml.c5.2xlarge", "--max-instances", "2"],
     "error: --scaling-metric gpu: ml.c5.2xlarge has no GPU, so GPUUtilization is never emitted; use "
     "--scaling-metric invocations"),
    (["--triton-version", "23.02"], "error: --triton-version 23.02: the SageMaker Triton containers before 23.07 "
                                    "ignore SAGEMAKER_TRITON_ADDITIONAL_ARGS"),
    (["--instance-count", "6", "--max-instances", "4"], "error: --instance-count 6 is outside --min-instances 1 .. "
                                                        "--max-instances 4"),
])
def test_deploy_refuses_in_one_line_what_the_endpoint_would_silently_get_wrong(extra, said, capsys):
    assert cli.main(deploy_args("x", *extra, "--dry-run")) == 2
    assert capsys.readouterr().err.startswith(said)


def test_deploy_says_in_one_line_that_a_named_profile_does_not_exist(monkeypatch, capsys):
    """botocore's ProfileNotFound was a traceback, even with --dry-run."""
    monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
    args = deploy_args("x", "--dry-run")
    del args[args.index("--region"):args.index("--region") + 2]  # the region comes from the session
    assert cli.main(args) == 2
    assert "error: deploy: The config profile (no-such-profile) could not be found" in capsys.readouterr().err


def test_deploy_prints_calls_and_creates_nothing_when_dry_run(moto_server, capsys):
    code = cli.main(deploy_args("dry-ep", "--max-instances", "2", "--scaling-metric", "invocations",
                                "--endpoint-url", moto_server, "--dry-run"))
    assert code == 0
    out = capsys.readouterr().out
    assert "# dry run: 6 calls" in out
    for call in ("sagemaker.create_model(", "sagemaker.create_endpoint_config(", "sagemaker.create_endpoint(",
                 "sagemaker.wait_until_endpoint_in_service(",
                 "application-autoscaling.register_scalable_target(", "application-autoscaling.put_scaling_policy("):
        assert call in out
    assert '"Mode": "MultiModel"' in out and "SageMakerVariantInvocationsPerInstance" in out
    sm = boto3.client("sagemaker", endpoint_url=moto_server, region_name="us-east-1")
    assert not [e for e in sm.list_endpoints()["Endpoints"] if e["EndpointName"] == "dry-ep"]


def test_deploy_plan_gives_the_model_tritonpack_container_environment_and_env_options_override_it(capsys):
    environment = aws.deploy_plan(aws.DeploySpec("x", "s3://b/p/", ROLE, "eu-west-1"))[0].params[
        "PrimaryContainer"]["Environment"]
    assert environment == {"SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "16777216",
                           "SAGEMAKER_TRITON_SHM_GROWTH_BYTE_SIZE": "1048576",
                           "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--disable-auto-complete-config"}
    assert cli.main(deploy_args("x", "--env", "SAGEMAKER_TRITON_ADDITIONAL_ARGS=", "--env", "A=b=c", "--dry-run")) == 0
    out = capsys.readouterr().out
    assert '"SAGEMAKER_TRITON_ADDITIONAL_ARGS": ""' in out and '"A": "b=c"' in out
    assert cli.main(deploy_args("x", "--env", "NO_EQUALS_SIGN", "--dry-run")) == 2
    assert capsys.readouterr().err == ("error: --env 'NO_EQUALS_SIGN': write KEY=VALUE, e.g. --env "
                                       "SAGEMAKER_TRITON_ADDITIONAL_ARGS=\n")


def test_serve_flags_follow_the_container_environment_as_the_serve_script_reads_it():
    assert serve_flags(CONTAINER_ENVIRONMENT) == ["--backend-config=python,shm-default-byte-size=16777216",
                                                  "--backend-config=python,shm-growth-byte-size=1048576",
                                                  "--disable-auto-complete-config"]
    stock = serve_flags({})  # an endpoint whose model sets nothing: serve's defaults, auto-complete on
    assert stock == serve_flags({"SAGEMAKER_TRITON_ADDITIONAL_ARGS": ""}) == serve_flags(CONTAINER_ENVIRONMENT)[:2]
    assert serve_flags({"SAGEMAKER_TRITON_SHM_DEFAULT_BYTE_SIZE": "33554432",
                        "SAGEMAKER_TRITON_ADDITIONAL_ARGS": "--log-verbose=1  --exit-timeout-secs='5'"}) == [
        "--backend-config=python,shm-default-byte-size=33554432",
        "--backend-config=python,shm-growth-byte-size=1048576", "--log-verbose=1", "--exit-timeout-secs=5"]


def test_deploy_plan_has_no_scaling_calls_when_max_instances_not_given():
    spec = aws.DeploySpec("x", "s3://b/p/", ROLE, "eu-west-1", environment={"A": "1"})
    calls = aws.deploy_plan(spec)
    assert [c.operation for c in calls] == ["create_model", "create_endpoint_config", "create_endpoint"]
    assert calls[0].params["PrimaryContainer"]["Environment"]["A"] == "1"
    with pytest.raises(UserError, match="s3://"):
        aws.DeploySpec("x", "b/p", ROLE, "eu-west-1")
