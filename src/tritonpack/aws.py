"""`tritonpack upload` (tarballs to S3, with copies) and `tritonpack deploy` (a SageMaker multi-model endpoint).

Both take `--endpoint-url` so that they can talk to any S3/SageMaker-compatible API (tests use moto's server).
`deploy` first builds a plan, a list of API calls; `--dry-run` prints it, otherwise each call is made and what
it created is printed.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tritonpack.containers import ADDITIONAL_ARGS, CONTAINER_ENVIRONMENT, parse_environment
from tritonpack.errors import TritonpackError, UserError

MIB = 1024 * 1024
TAR_SUFFIX = ".tar.gz"
REASON_CHARS = 600  # of a server's message in one error line (an HTML page may answer)
DEFAULT_TRITON_VERSION = "24.09"
TRITON_REPOSITORY = "sagemaker-tritonserver"
# Account of the SageMaker Triton images per region (sagemaker-python-sdk image_uri_config/sagemaker-tritonserver.json,
# the same for every version it lists: 23.12 … 24.09).
TRITON_ACCOUNTS = {
    "af-south-1": "626614931356", "il-central-1": "780543022126", "ap-east-1": "871362719292",
    "ap-northeast-1": "763104351884", "ap-northeast-2": "763104351884", "ap-northeast-3": "364406365360",
    "ap-south-1": "763104351884", "ap-southeast-1": "763104351884", "ap-southeast-2": "763104351884",
    "ap-southeast-3": "907027046896", "ca-central-1": "763104351884", "ca-west-1": "204538143572",
    "cn-north-1": "727897471807", "cn-northwest-1": "727897471807", "eu-central-1": "763104351884",
    "eu-north-1": "763104351884", "eu-west-1": "763104351884", "eu-west-2": "763104351884",
    "eu-west-3": "763104351884", "eu-south-1": "692866216735", "me-south-1": "217643126080",
    "sa-east-1": "763104351884", "us-east-1": "763104351884", "us-east-2": "763104351884",
    "us-west-1": "763104351884", "us-west-2": "763104351884",
}
VARIANT = "AllTraffic"
# The first SageMaker Triton container whose serve script reads SAGEMAKER_TRITON_ADDITIONAL_ARGS (tritonpack's
# container environment) and whose Python runs the packed environments (3.10 and later)
OLDEST_TRITON_VERSION = "23.07"
# GPUs of the multi-GPU SageMaker instance sizes (other ml.g*/ml.p* sizes have one): GPUUtilization is the sum
# over an instance's GPUs, 0-100 % each, so a target per GPU is multiplied by these
GPUS = {**{f"ml.{family}.{size}": 4 for family in ("g4dn", "g5", "g6", "g6e") for size in ("12xlarge", "24xlarge")},
        **{f"ml.{family}.48xlarge": 8 for family in ("g5", "g6", "g6e")},
        "ml.g4dn.metal": 8, "ml.p3.8xlarge": 4, "ml.p3.16xlarge": 8, "ml.p3dn.24xlarge": 8, "ml.p4d.24xlarge": 8,
        "ml.p4de.24xlarge": 8, "ml.p5.48xlarge": 8, "ml.p5e.48xlarge": 8}


def gpus(instance_type: str) -> int:
    """GPUs of a SageMaker instance type; 0 for a CPU type."""
    if not re.match(r"ml\.(g\d|p\d)", instance_type):
        return 0
    return GPUS.get(instance_type, 1)


@contextmanager
def aws_errors(what: str, refused: type[TritonpackError] = UserError):
    """An error the AWS API (or botocore) reports becomes one line naming the call, the code and AWS's reason; a
    refusal (an error answer) is raised as `refused`: `infer --mme` says an endpoint's refusal of a request with exit
    status 1, as `infer --url` says Triton's."""
    from boto3.exceptions import Boto3Error
    from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError, WaiterError

    try:
        yield
    except ClientError as e:
        error = e.response.get("Error", {})
        reason = one_line(error.get("Message", e))  # even where an HTML page answered
        raise refused(f"{what}: refused: {error.get('Code', 'error')}: {reason}") from None
    except NoCredentialsError as e:
        raise UserError(f"{what}: {e}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or run "
                        f"`aws configure`") from None
    except EndpointConnectionError as e:
        raise UserError(f"{what}: {e}: is the endpoint up? (a local MME: `tritonpack mme --models dist`)") from None
    except WaiterError as e:  # an endpoint that ended Failed: its FailureReason says why (undoing deletes it)
        reason = " ".join(str((e.last_response or {}).get("FailureReason", "")).split())[:300]
        raise UserError(f"{what}: {e}{f'; FailureReason: {reason}' if reason else ''}") from None
    except (BotoCoreError, Boto3Error) as e:  # boto3's transfers wrap what S3 answered (S3UploadFailedError)
        raise UserError(f"{what}: {e}") from None


def one_line(text, limit: int = REASON_CHARS) -> str:
    """`text` on one line; past `limit` characters its middle is left out, not its end, where a server's message
    says why (Triton's load refusal ends with the reason its model failed)."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head = limit // 3
    return f"{text[:head]} … {text[len(text) - (limit - head):]}"


def endpoint_url(text: str) -> str:
    """An API endpoint option's value (argparse type): botocore takes only http(s)://host[:port]."""
    import argparse
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r}: write the endpoint as http://host:port (or https://…)")
    return text


def split_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/prefix/` → (bucket, "prefix/"); the prefix is empty or ends with '/'."""
    if not url.startswith("s3://") or not url[5:].split("/", 1)[0]:
        raise UserError(f"expected s3://bucket/prefix/, got {url!r}")
    bucket, _, prefix = url[5:].partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


def triton_image_uri(region: str, version: str = DEFAULT_TRITON_VERSION) -> str:
    """The SageMaker Triton container image for `region` and container `version` (e.g. 24.09)."""
    if region not in TRITON_ACCOUNTS:
        raise UserError(f"no SageMaker Triton image is published in {region!r}; regions: "
                         f"{', '.join(sorted(TRITON_ACCOUNTS))}")
    domain = "amazonaws.com.cn" if region.startswith("cn-") else "amazonaws.com"
    return f"{TRITON_ACCOUNTS[region]}.dkr.ecr.{region}.{domain}/{TRITON_REPOSITORY}:{version}-py3"


# ---- upload ---------------------------------------------------------------------------------------------------
def copy_keys(tarball: Path, prefix: str, copies: int) -> list[str]:
    """Keys for `copies` copies: `<prefix><name>` for one, `<prefix><stem>-<i>.tar.gz` (i = 0…N-1) for more."""
    name = Path(tarball).name
    if copies <= 1:
        return [prefix + name]
    stem = name[: -len(TAR_SUFFIX)] if name.endswith(TAR_SUFFIX) else Path(name).stem
    return [f"{prefix}{stem}-{i}{TAR_SUFFIX}" for i in range(copies)]


class Progress:
    """A one-line progress bar on stderr (redrawn in place on a terminal, a line per 10% otherwise)."""

    def __init__(self, total_bytes: int, total_items: int, stream=None, width: int = 30):
        self.total_bytes, self.total_items = max(total_bytes, 1), total_items
        self.stream = stream or sys.stderr
        self.width, self.bytes, self.items = width, 0, 0
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._shown = -1.0
        self._tty = getattr(self.stream, "isatty", lambda: False)()

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes += n
            self._draw()

    def item_done(self) -> None:
        with self._lock:
            self.items += 1
            self._draw()

    def _draw(self, final: bool = False) -> None:
        fraction = min(self.bytes / self.total_bytes, 1.0)
        step = fraction if self._tty else int(fraction * 10) / 10
        now = time.monotonic()
        if not final and (step == self._shown or (self._tty and now - getattr(self, "_at", 0) < 0.1)):
            return
        self._shown, self._at = step, now
        elapsed = max(now - self.started, 1e-6)
        bar = "#" * int(fraction * self.width)
        line = (f"[{bar:<{self.width}}] {fraction:4.0%} {self.items}/{self.total_items} objects "
                f"{self.bytes / MIB:,.1f}/{self.total_bytes / MIB:,.1f} MiB {self.bytes / MIB / elapsed:,.1f} MiB/s")
        self.stream.write(("\r" + line) if self._tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        with self._lock:
            self._draw(final=True)
            if self._tty:
                self.stream.write("\n")
            self.stream.flush()


def existing_keys(client, bucket: str, keys: list[str]) -> list[str]:
    """Those of `keys` that exist in `bucket`, in order (a listing of their common prefix, not a request per key)."""
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=os.path.commonprefix(keys))
    found = {item["Key"] for page in pages for item in page.get("Contents", ())}
    return [key for key in keys if key in found]


@dataclass
class UploadResult:
    urls: list[str]
    bytes: int
    seconds: float


def upload(tarballs: Sequence[Path], destination: str, copies: int = 1, endpoint_url: str | None = None,
           client=None, threads: int = 8, chunk_bytes: int = 16 * MIB, progress: bool = True,
           overwrite: bool = False) -> UploadResult:
    """Upload each tarball once (multipart above `chunk_bytes`), then make its other copies server-side.

    Copies are S3 CopyObject calls (multipart copy for large objects): the bytes cross the network once however
    many copies are asked for. A key that exists already is not replaced unless `overwrite`: an MME instance that
    loaded the object under that name keeps serving its old bytes (AWS: give a changed model a new name).
    """
    import boto3
    from boto3.s3.transfer import TransferConfig

    bucket, prefix = split_s3_url(destination)
    tarballs = [Path(t) for t in tarballs]
    for tarball in tarballs:
        if tarball.is_dir():
            raise UserError(f"{tarball} is a folder: upload takes MME tarballs ({tarball}.tar.gz)")
        if not tarball.is_file():
            raise UserError(f"{tarball}: no such file")
    if copies < 1 or threads < 1:
        raise UserError(f"--copies and --threads must be at least 1, got {copies} and {threads}")
    client = client or boto3.client("s3", endpoint_url=endpoint_url)
    config = TransferConfig(multipart_threshold=chunk_bytes, multipart_chunksize=chunk_bytes,
                            max_concurrency=threads, use_threads=True)
    plan = [(t, copy_keys(t, prefix, copies)) for t in tarballs]
    owners: dict[str, Path] = {}
    for tarball, keys in plan:
        for key in keys:
            if owners.setdefault(key, tarball) != tarball:
                raise UserError(f"{owners[key]} and {tarball} would both be uploaded as s3://{bucket}/{key}: give "
                                f"them different file names")
    if not overwrite:
        taken = existing_keys(client, bucket, [key for _, keys in plan for key in keys])
        if taken:
            more = f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""
            raise UserError(f"s3://{bucket}/{taken[0]}{more} exists: an endpoint may have loaded it, and would go on "
                            f"serving the old bytes under that name; upload under a new file name or prefix, or pass "
                            f"--overwrite")
    total = sum(t.stat().st_size * len(keys) for t, keys in plan)
    bar = Progress(total, sum(len(keys) for _, keys in plan)) if progress else None
    started = time.monotonic()
    urls = []

    def tick(n: int) -> None:
        if bar:
            bar.add_bytes(n)

    for tarball, keys in plan:
        first, rest = keys[0], keys[1:]
        client.upload_file(str(tarball), bucket, first, Config=config, Callback=tick)
        if bar:
            bar.item_done()
        urls.append(f"s3://{bucket}/{first}")

        def copy(key: str, source: str = first) -> str:
            client.copy({"Bucket": bucket, "Key": source}, bucket, key, Config=config, Callback=tick)
            if bar:
                bar.item_done()
            return f"s3://{bucket}/{key}"

        with ThreadPoolExecutor(max_workers=threads) as pool:
            urls += list(pool.map(copy, rest))
    if bar:
        bar.close()
    return UploadResult(urls, total, time.monotonic() - started)


def cmd_upload(args) -> int:
    with aws_errors("upload"):
        result = upload([Path(t) for t in args.tarballs], args.destination, copies=args.copies,
                        endpoint_url=args.endpoint_url, threads=args.threads, progress=not args.quiet,
                        overwrite=args.overwrite)
    for url in result.urls if args.list else result.urls[:3]:
        print(url)
    if not args.list and len(result.urls) > 3:
        print(f"… {len(result.urls) - 3} more")
    print(f"uploaded {len(result.urls)} objects ({result.bytes / MIB:,.1f} MiB) in {result.seconds:.1f}s",
          file=sys.stderr)
    return 0


# ---- deploy ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    service: str  # boto3 client name
    operation: str  # snake_case boto3 method
    params: dict

    def __str__(self) -> str:
        return f"{self.service}.{self.operation}({json.dumps(self.params, indent=2, sort_keys=True)})"


@dataclass(frozen=True)
class DeploySpec:
    name: str
    model_data_url: str  # s3://bucket/prefix/ holding the tarballs
    role_arn: str
    region: str
    triton_version: str = DEFAULT_TRITON_VERSION
    image: str | None = None  # overrides the image chosen from region and version
    instance_type: str = "ml.g5.xlarge"
    instance_count: int = 1
    environment: dict = field(default_factory=dict)
    min_instances: int = 1
    max_instances: int = 0  # 0: no autoscaling
    scaling_metric: str = ""  # gpu: GPUUtilization (custom metric); invocations: InvocationsPerInstance; "": gpu on
    # GPU instance types, invocations on others
    target_value: float = 0.0  # 0: 60 % per GPU for GPUUtilization, 1000 for InvocationsPerInstance
    scale_in_cooldown: int = 600
    scale_out_cooldown: int = 200

    def __post_init__(self) -> None:
        split_s3_url(self.model_data_url)
        if len(self.name) > 56 or not re.fullmatch(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*", self.name):
            raise UserError(f"--name {self.name!r}: letters, digits and hyphens, at most 56 (SageMaker names take 63, "
                            f"and the config is named <name>-config)")
        if self.image is None and not re.fullmatch(r"\d\d\.\d\d", self.triton_version):
            raise UserError(f"--triton-version {self.triton_version!r}: a container release such as "
                            f"{DEFAULT_TRITON_VERSION}")
        if self.image is None and self.triton_version < OLDEST_TRITON_VERSION:
            raise UserError(f"--triton-version {self.triton_version}: the SageMaker Triton containers before "
                            f"{OLDEST_TRITON_VERSION} ignore {ADDITIONAL_ARGS} and cannot run the tarballs' packed "
                            f"environments; use {DEFAULT_TRITON_VERSION}, the release `tritonpack build` targets")
        if self.min_instances < 1:
            raise UserError("--min-instances must be at least 1")
        if self.scaling_metric not in ("", "gpu", "invocations"):
            raise UserError(f"scaling metric {self.scaling_metric!r}: gpu or invocations")
        if self.scaling_metric == "gpu" and not gpus(self.instance_type):
            raise UserError(f"--scaling-metric gpu: {self.instance_type} has no GPU, so GPUUtilization is never "
                            f"emitted; use --scaling-metric invocations")
        if self.max_instances and self.max_instances < self.min_instances:
            raise UserError("--max-instances must be at least --min-instances")
        if self.instance_count < 1:
            raise UserError("--instance-count must be at least 1")
        if self.max_instances and not self.min_instances <= self.instance_count <= self.max_instances:
            raise UserError(f"--instance-count {self.instance_count} is outside --min-instances "
                            f"{self.min_instances} .. --max-instances {self.max_instances}")

    @property
    def metric(self) -> str:
        return self.scaling_metric or ("gpu" if gpus(self.instance_type) else "invocations")


def deploy_plan(spec: DeploySpec) -> list[Call]:
    """The calls that create the model (Mode=MultiModel), endpoint config, endpoint and autoscaling policy."""
    bucket, prefix = split_s3_url(spec.model_data_url)
    image = spec.image or triton_image_uri(spec.region, spec.triton_version)
    model, config, endpoint = f"{spec.name}-model", f"{spec.name}-config", spec.name
    calls = [
        Call("sagemaker", "create_model", {
            "ModelName": model,
            "ExecutionRoleArn": spec.role_arn,
            "PrimaryContainer": {
                "Image": image,
                "ModelDataUrl": f"s3://{bucket}/{prefix}",
                "Mode": "MultiModel",
                "Environment": {**CONTAINER_ENVIRONMENT, **spec.environment},
            },
        }),
        Call("sagemaker", "create_endpoint_config", {
            "EndpointConfigName": config,
            "ProductionVariants": [{"VariantName": VARIANT, "ModelName": model, "InstanceType": spec.instance_type,
                                    "InitialInstanceCount": spec.instance_count}],
        }),
        Call("sagemaker", "create_endpoint", {"EndpointName": endpoint, "EndpointConfigName": config}),
    ]
    if spec.max_instances:
        # AWS's own examples register the variant once the endpoint is InService (minutes after create_endpoint)
        calls.append(Call("sagemaker", "wait_until_endpoint_in_service", {"EndpointName": endpoint}))
        resource = f"endpoint/{endpoint}/variant/{VARIANT}"
        dimension = "sagemaker:variant:DesiredInstanceCount"
        calls.append(Call("application-autoscaling", "register_scalable_target", {
            "ServiceNamespace": "sagemaker", "ResourceId": resource, "ScalableDimension": dimension,
            "MinCapacity": spec.min_instances, "MaxCapacity": spec.max_instances,
        }))
        if spec.metric == "gpu":
            metric = {"CustomizedMetricSpecification": {
                "MetricName": "GPUUtilization", "Namespace": "/aws/sagemaker/Endpoints",
                "Dimensions": [{"Name": "EndpointName", "Value": endpoint}, {"Name": "VariantName", "Value": VARIANT}],
                "Statistic": "Average", "Unit": "Percent"}}
            target = (spec.target_value or 60.0) * gpus(spec.instance_type)
        else:
            metric = {"PredefinedMetricSpecification": {
                "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}}
            target = spec.target_value or 1000.0
        calls.append(Call("application-autoscaling", "put_scaling_policy", {
            "PolicyName": f"{endpoint}-{'gpu-util' if spec.metric == 'gpu' else 'invocations'}-tracking",
            "ServiceNamespace": "sagemaker", "ResourceId": resource, "ScalableDimension": dimension,
            "PolicyType": "TargetTrackingScaling",
            "TargetTrackingScalingPolicyConfiguration": {
                "TargetValue": target, **metric,
                "ScaleInCooldown": spec.scale_in_cooldown, "ScaleOutCooldown": spec.scale_out_cooldown},
        }))
    return calls


CREATED = {"create_model": "ModelArn", "create_endpoint_config": "EndpointConfigArn",
           "create_endpoint": "EndpointArn", "put_scaling_policy": "PolicyARN",
           "register_scalable_target": "ScalableTargetARN"}


WAIT_UNTIL = "wait_until_"
# How to delete what a call created: (operation, the parameters of the creating call it takes)
UNDO = {"create_model": ("delete_model", ("ModelName",)),
        "create_endpoint_config": ("delete_endpoint_config", ("EndpointConfigName",)),
        "create_endpoint": ("delete_endpoint", ("EndpointName",)),
        "register_scalable_target": ("deregister_scalable_target", ("ServiceNamespace", "ResourceId",
                                                                    "ScalableDimension"))}


def run_plan(calls: Sequence[Call], region: str, endpoint_url: str | None = None,
             client_factory: Callable | None = None, out=None) -> list[dict]:
    """Make each call in order; print what each created. At the first failure (boto3's error) what this run created
    is deleted again, newest first, so that the same deploy can simply be run again."""
    import boto3

    out = out or sys.stdout
    clients: dict[str, object] = {}
    responses, done = [], []
    for call in calls:
        try:
            with aws_errors(f"{call.service}.{call.operation}"):
                if call.service not in clients:
                    clients[call.service] = (client_factory or boto3.client)(call.service, region_name=region,
                                                                            endpoint_url=endpoint_url)
                client = clients[call.service]
                if call.operation.startswith(WAIT_UNTIL):  # a boto3 waiter, not an API operation
                    state = call.operation[len(WAIT_UNTIL):]
                    print(f"{call.service}: waiting until {call.params} is {state} (minutes)", file=out, flush=True)
                    client.get_waiter(state).wait(**call.params)
                    continue
                response = getattr(client, call.operation)(**call.params)
        except UserError as e:
            undone = _undo(done, clients)
            raise UserError(f"{e}{'; undone: ' + ', '.join(undone) if undone else ''}") from None
        done.append(call)
        responses.append(response)
        created = response.get(CREATED.get(call.operation, ""), "")
        what = created or call.params.get("PolicyName") or call.params.get("ResourceId", "")
        print(f"{call.service}.{call.operation}: {what}", file=out)
    return responses


def _undo(done: Sequence[Call], clients: dict) -> list[str]:
    """Delete what `done` created, newest first; what was deleted, or could not be."""
    said = []
    for call in reversed(done):
        if call.operation not in UNDO:
            continue  # a scaling policy goes with its scalable target
        operation, keys = UNDO[call.operation]
        params = {key: call.params[key] for key in keys}
        name = params.get("ResourceId") or params[keys[0]]
        try:
            getattr(clients[call.service], operation)(**params)
            said.append(f"{operation} {name}")
        except Exception as e:  # noqa: BLE001 - reported; the user deletes it by hand
            said.append(f"{operation} {name} FAILED ({type(e).__name__}): delete it by hand")
    return said


def cmd_deploy(args) -> int:
    import boto3

    with aws_errors("deploy"):  # a named profile that does not exist fails here
        region = args.region or boto3.session.Session().region_name or "us-east-1"
    environment = parse_environment(args.env)
    spec = DeploySpec(
        name=args.name, model_data_url=args.model_data_url, role_arn=args.role, region=region,
        triton_version=args.triton_version, image=args.image, instance_type=args.instance_type,
        instance_count=args.instance_count, environment=environment, min_instances=args.min_instances,
        max_instances=args.max_instances, scaling_metric=args.scaling_metric or "", target_value=args.target_value,
    )
    calls = deploy_plan(spec)
    if args.dry_run:
        print(f"# dry run: {len(calls)} calls in {region}, none made")
        for call in calls:
            print(call)
        return 0
    run_plan(calls, region, endpoint_url=args.endpoint_url)
    print(f"endpoint {spec.name} is being created; invoke with --target-model <tarball under "
          f"{spec.model_data_url}> once it is InService", file=sys.stderr)
    return 0


def add_command(subparsers) -> None:
    u = subparsers.add_parser("upload", help="upload MME tarballs to s3://bucket/prefix/ (multipart, with copies)",
                              description=upload.__doc__)
    u.add_argument("tarballs", nargs="+", metavar="TARBALL")
    u.add_argument("destination", metavar="s3://bucket/prefix/")
    u.add_argument("--copies", type=int, default=1, help="N copies named <stem>-<i>.tar.gz (default 1: own name)")
    u.add_argument("--endpoint-url", type=endpoint_url, help="S3 endpoint (an S3-compatible store, moto)")
    u.add_argument("--threads", type=int, default=8, help="parallel parts and copies (default 8)")
    u.add_argument("--list", action="store_true", help="print every uploaded URL, not only the first ones")
    u.add_argument("--quiet", action="store_true", help="no progress bar")
    u.add_argument("--overwrite", action="store_true",
                   help="replace objects that exist already (an endpoint that loaded one keeps its old bytes)")
    u.set_defaults(func=cmd_upload)

    d = subparsers.add_parser("deploy", help="create a SageMaker multi-model endpoint on the Triton image",
                              description="Creates the SageMaker model (Mode=MultiModel, ModelDataUrl = the "
                                          "tarballs' S3 prefix, the SageMaker Triton image for the region), the "
                                          "endpoint config, the endpoint and, with --max-instances, a target "
                                          "tracking autoscaling policy. --dry-run prints the calls only.")
    d.add_argument("--name", required=True, help="endpoint name (model and config are <name>-model/-config)")
    d.add_argument("--model-data-url", required=True, help="s3://bucket/prefix/ holding the tarballs")
    d.add_argument("--role", required=True, help="SageMaker execution role ARN")
    d.add_argument("--region", help="default: the boto3 session's region, else us-east-1")
    d.add_argument("--triton-version", default=DEFAULT_TRITON_VERSION,
                   help=f"SageMaker Triton container version (default {DEFAULT_TRITON_VERSION})")
    d.add_argument("--image", help="container image URI (overrides region and version)")
    d.add_argument("--instance-type", default="ml.g5.xlarge")
    d.add_argument("--instance-count", type=int, default=1)
    d.add_argument("--env", action="append", metavar="KEY=VALUE",
                   help="container environment over tritonpack's (repeatable): shared memory 16 MB / 1 MB and "
                        f"{ADDITIONAL_ARGS}=--disable-auto-complete-config (serve reads it from 23.07)")
    d.add_argument("--min-instances", type=int, default=1)
    d.add_argument("--max-instances", type=int, default=0, help="enable autoscaling up to N instances")
    d.add_argument("--scaling-metric", choices=("gpu", "invocations"),
                   help="gpu: GPUUtilization (custom metric, target 60 %% per GPU of the instance); invocations: "
                        "SageMakerVariantInvocationsPerInstance (target 1000); default: gpu on GPU instance types, "
                        "invocations on others")
    d.add_argument("--target-value", type=float, default=0.0,
                   help="target of the tracking policy (for gpu: per GPU, multiplied by the instance's GPUs)")
    d.add_argument("--endpoint-url", type=endpoint_url,
                   help="API endpoint for SageMaker and Application Auto Scaling (moto)")
    d.add_argument("--dry-run", action="store_true", help="print the calls, make none")
    d.set_defaults(func=cmd_deploy)
