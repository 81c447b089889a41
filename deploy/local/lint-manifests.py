"""Checks the rendered overlays for deployment defects no schema catches; run by `make lint`.

    lint-manifests.py RENDERED.yaml...              check each rendered overlay, and the files
                                                    beside them (dashboard, roles, docs)
    lint-manifests.py --self-test RENDERED.yaml...  put each defect back into a copy of the
                                                    renderings and files, in memory, and check
                                                    that every one is caught

Each RENDERED.yaml is one overlay as `kubectl kustomize` renders it (named after the overlay;
`production-relay` is the production overlay with the optional relay component).
The checks, each an error that fails the lint:

- tls-app-protocol: a Service port that declares a cleartext protocol (`kubernetes.io/h2c`,
  `http`, `grpc`, ...) must not lead to a container port served with TLS (the server's
  LISTEN_ADDR port while TLS_CERT_FILE is set).
- hpa-replicas: a Deployment a HorizontalPodAutoscaler scales sets no `spec.replicas`.
- connections: the ConfigMap inventory-database-limits declares the database's
  `max_connections` and the connections kept for everyone else (`reserved_connections`);
  (HPA maxReplicas + maxSurge) x tenants (TENANTS) x (DATABASE_POOL_SIZE + 1 LISTEN
  connection) + 1 per CronJob that connects + reserved must fit, plus, for each Deployment
  of `inventory-server relay`, (replicas + maxSurge) x its tenants x (2 pooled + 1 LISTEN).
  A PostgreSQL the overlay runs itself is started with that same max_connections.
- credentials: the migrate initContainer, the server and the verify CronJob each connect with
  their own credential, and the relay not with migrate's: neither the same Secret key nor,
  where the Secret is in the rendering, the same PostgreSQL user (deploy/sql/roles.sql).
- network-policy: the gRPC port admits callers only by the label CALLER_LABEL on both their
  namespace and their pods, the label docs/operations.md tells operators to set.
- verify-export: where an alert reads inventory_verify_drift, the verify CronJob exports it
  over OTLP (an endpoint with a value) with the namespace as a resource attribute.
- alert-selectors: some alert fires on absent(up{...}); every `up` job matcher matches the
  PodMonitor's job (<namespace>/<name>); every deployment= and cronjob= matcher names an
  object the overlay renders.
- dashboard: no variable's "All" value (allValue) matches an empty label, which would take
  in series without a pod (pushed over OTLP) beside the scraped ones.
- roles-copy: the dev overlay's initdb/10-roles.sql is deploy/sql/roles.sql.
"""

import base64
import copy
import json
import math
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/inventory.json"
ROLES = ROOT / "deploy/sql/roles.sql"
DEV_ROLES = ROOT / "deploy/k8s/overlays/dev/initdb/10-roles.sql"
DOCS = ROOT / "docs/operations.md"

# The label the NetworkPolicy admits gRPC callers by, on their namespace and their pods.
CALLER_LABEL = "inventory/client"
# The ConfigMap that declares the database's connection limit.
LIMITS = "inventory-database-limits"
# appProtocol values that tell a proxy to speak cleartext to the port.
CLEARTEXT = {"kubernetes.io/h2c", "kubernetes.io/ws", "h2c", "http", "http2", "grpc", "grpc-web"}
# The server's defaults (inventory-server serve --help).
DEFAULT_LISTEN_PORT = 50051
DEFAULT_POOL_SIZE = 16
# `inventory-server relay`'s pool per tenant (src/relay.rs), beside its LISTEN connection.
RELAY_POOL_SIZE = 2
OTLP_METRICS = ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def ref(doc):
    return f'{doc["kind"]}/{doc["metadata"]["name"]}'


def base_name(name):
    """A generated object's name without kustomize's hash suffix."""
    return re.sub(r"-[a-z0-9]{10}$", "", name)


class Overlay:
    """One rendered overlay: its documents, and lookups over them."""

    def __init__(self, name, documents):
        self.name = name
        self.documents = documents

    def of_kind(self, *kinds):
        return [d for d in self.documents if d.get("kind") in kinds]

    def find(self, kind, name):
        return next((d for d in self.of_kind(kind) if d["metadata"]["name"] == name), None)

    def config_map(self, name):
        return self.find("ConfigMap", name)

    def workloads(self):
        """(workload, pod template) of everything that runs pods."""
        for doc in self.of_kind("Deployment", "StatefulSet", "DaemonSet", "Job"):
            yield doc, doc["spec"]["template"]
        for doc in self.of_kind("CronJob"):
            yield doc, doc["spec"]["jobTemplate"]["spec"]["template"]

    def env(self, container, name):
        """What `name` is set to in `container`: ("value", text), ("secret", (name, key)),
        ("field", path) or None. An unresolvable ConfigMap key counts as unset."""
        for entry in container.get("env", []):
            if entry.get("name") != name:
                continue
            if "value" in entry:
                return ("value", str(entry["value"]))
            source = entry.get("valueFrom", {})
            if "secretKeyRef" in source:
                secret = source["secretKeyRef"]
                return ("secret", (secret["name"], secret["key"]))
            if "configMapKeyRef" in source:
                key = source["configMapKeyRef"]
                config = self.config_map(key["name"]) or {}
                value = config.get("data", {}).get(key["key"])
                return None if value is None else ("value", str(value))
            if "fieldRef" in source:
                return ("field", source["fieldRef"]["fieldPath"])
            return None
        for source in container.get("envFrom", []):
            name_ref = source.get("configMapRef", {}).get("name")
            if name_ref:
                data = (self.config_map(name_ref) or {}).get("data", {})
                if name in data:
                    return ("value", str(data[name]))
        return None

    def env_value(self, container, name):
        found = self.env(container, name)
        return found[1] if found and found[0] == "value" else None

    def secret_user(self, secret_ref):
        """The PostgreSQL user of a URL Secret in the rendering, if it is there."""
        secret = self.find("Secret", secret_ref[0])
        if not secret:
            return None
        if secret_ref[1] in secret.get("stringData", {}):
            url = secret["stringData"][secret_ref[1]]
        elif secret_ref[1] in secret.get("data", {}):
            url = base64.b64decode(secret["data"][secret_ref[1]]).decode()
        else:
            return None
        return urlsplit(url).username


def server_containers(template):
    """The containers of a pod template that run inventory-server, with its command."""
    spec = template["spec"]
    for container in spec.get("initContainers", []) + spec.get("containers", []):
        args = container.get("args") or container.get("command") or []
        if "inventory-server" in container.get("image", "") and args:
            yield args[0], container


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def selects(selector, labels):
    """Whether a label selector (matchLabels and matchExpressions) selects `labels`."""
    if not selector:
        return True
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and labels.get(key) in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def selects_by_caller_label(selector):
    if not selector:
        return False
    if CALLER_LABEL in selector.get("matchLabels", {}):
        return True
    return any(
        e["key"] == CALLER_LABEL and e["operator"] in ("Exists", "In")
        for e in selector.get("matchExpressions", [])
    )


def running(overlay, command):
    """(workload, pod template, container) of every inventory-server `command`."""
    for workload, template in overlay.workloads():
        for found, container in server_containers(template):
            if found == command:
                yield workload, template, container


def serving(overlay):
    """(Deployment, pod template, server container) of every inventory-server `serve`."""
    return running(overlay, "serve")


def tenant_count(overlay, container):
    return len([t for t in re.split(r"[,\s]+", overlay.env_value(container, "TENANTS") or "default") if t])


# ---------------------------------------------------------------------------------------
# The checks of one rendered overlay.


def check_tls_app_protocol(overlay):
    problems = []
    for service in overlay.of_kind("Service"):
        selector = service["spec"].get("selector")
        if not selector:
            continue
        for port in service["spec"].get("ports", []):
            protocol = port.get("appProtocol")
            if protocol not in CLEARTEXT:
                continue
            target = port.get("targetPort", port["port"])
            for workload, template, container in serving(overlay):
                if not selects({"matchLabels": selector}, template["metadata"].get("labels", {})):
                    continue
                numbers = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
                number = numbers.get(target) if isinstance(target, str) else target
                listen = overlay.env_value(container, "LISTEN_ADDR")
                grpc_port = port_of(listen) if listen else DEFAULT_LISTEN_PORT
                if number == grpc_port and overlay.env_value(container, "TLS_CERT_FILE"):
                    problems.append(
                        f"{ref(service)} port {port.get('name', port['port'])} ({number}): "
                        f"appProtocol {protocol} declares cleartext, but {ref(workload)} "
                        f"container {container['name']} serves TLS there (TLS_CERT_FILE is "
                        "set): a mesh or gateway would speak cleartext to a TLS port; leave "
                        "appProtocol out on it"
                    )
    return problems


def check_hpa_replicas(overlay):
    problems = []
    for hpa in overlay.of_kind("HorizontalPodAutoscaler"):
        target = hpa["spec"]["scaleTargetRef"]
        workload = overlay.find(target["kind"], target["name"])
        if workload and "replicas" in workload["spec"]:
            problems.append(
                f"{ref(workload)} sets spec.replicas ({workload['spec']['replicas']}) while "
                f"{ref(hpa)} scales it: every apply or GitOps sync resets the autoscaler's "
                "count; leave replicas out"
            )
    return problems


def surge_of(deployment, replicas):
    strategy = deployment["spec"].get("strategy", {})
    if strategy.get("type") == "Recreate":
        return 0
    surge = strategy.get("rollingUpdate", {}).get("maxSurge", "25%")
    if isinstance(surge, str) and surge.endswith("%"):
        return math.ceil(replicas * int(surge[:-1]) / 100)
    return int(surge)


def check_connections(overlay):
    problems = []
    limits = next(
        (c for c in overlay.of_kind("ConfigMap") if base_name(c["metadata"]["name"]) == LIMITS),
        None,
    )
    deployments = [(w, c) for w, _, c in serving(overlay) if overlay.env(c, "DATABASE_URL")]
    if not deployments:
        return problems
    if limits is None:
        return [
            f"the database's max_connections is not declared: add ConfigMap {LIMITS} "
            "(max_connections, reserved_connections), so the pool can be sized against it"
        ]
    data = limits.get("data", {})
    try:
        max_connections = int(data["max_connections"])
        reserved = int(data["reserved_connections"])
    except (KeyError, ValueError):
        return [f"ConfigMap {LIMITS} needs integer max_connections and reserved_connections"]
    jobs = [
        w for w, t in overlay.workloads() if w["kind"] == "CronJob"
        and any(overlay.env(c, "DATABASE_URL") for _, c in server_containers(t))
    ]
    # The relays' pods (no HPA: their replicas, and a rollout's surge), each with a pool of
    # RELAY_POOL_SIZE and a LISTEN connection per tenant.
    relaying, relay_terms = 0, []
    for relay, _, container in running(overlay, "relay"):
        if not overlay.env(container, "DATABASE_URL"):
            continue
        replicas = relay["spec"].get("replicas", 1)
        surge = surge_of(relay, replicas)
        tenants = tenant_count(overlay, container)
        relaying += (replicas + surge) * tenants * (RELAY_POOL_SIZE + 1)
        relay_terms.append(
            f"{ref(relay)} ({replicas} replicas + {surge} surge) x {tenants} tenant(s) x "
            f"({RELAY_POOL_SIZE} pooled + 1 LISTEN)"
        )
    relay_text = "".join(f" + {term}" for term in relay_terms)
    for deployment, container in deployments:
        pool = int(overlay.env_value(container, "DATABASE_POOL_SIZE") or DEFAULT_POOL_SIZE)
        # One pool and one LISTEN connection per tenant.
        tenants = tenant_count(overlay, container)
        hpa = next(
            (h for h in overlay.of_kind("HorizontalPodAutoscaler")
             if h["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]),
            None,
        )
        replicas = hpa["spec"]["maxReplicas"] if hpa else deployment["spec"].get("replicas", 1)
        surge = surge_of(deployment, replicas)
        total = (replicas + surge) * tenants * (pool + 1) + len(jobs) + relaying + reserved
        if total > max_connections:
            what = f"{ref(hpa)} maxReplicas" if hpa else "replicas"
            problems.append(
                f"{ref(deployment)}: ({replicas} replicas ({what}) + {surge} surge) x "
                f"{tenants} tenant(s) x "
                f"(DATABASE_POOL_SIZE {pool} + 1 LISTEN) + {len(jobs)} CronJob(s)"
                f"{relay_text} + "
                f"{reserved} reserved = {total} connections, above the database's "
                f"max_connections {max_connections} (ConfigMap {LIMITS}): lower the pool or "
                "the maximum, or raise max_connections"
            )
    for workload, template in overlay.workloads():
        for container in template["spec"].get("containers", []):
            if not container.get("image", "").startswith("postgres"):
                continue
            words = " ".join(container.get("command", []) + container.get("args", []))
            found = re.search(r"max_connections=(\S+)", words)
            value = found.group(1) if found else None
            variable = re.fullmatch(r"\$\((\w+)\)", value or "")
            if variable:
                value = overlay.env_value(container, variable.group(1))
            if value is None:
                problems.append(
                    f"{ref(workload)} starts PostgreSQL with its default max_connections "
                    f"(100), not the {max_connections} ConfigMap {LIMITS} declares: start it "
                    "with -c max_connections=..."
                )
            elif int(value) != max_connections:
                problems.append(
                    f"{ref(workload)} starts PostgreSQL with max_connections {value}, but "
                    f"ConfigMap {LIMITS} declares {max_connections}"
                )
    return problems


def check_credentials(overlay):
    problems = []
    credentials = {}  # command -> [(workload, container, credential)]
    for workload, template in overlay.workloads():
        for command, container in server_containers(template):
            found = overlay.env(container, "DATABASE_URL")
            if found:
                credentials.setdefault(command, []).append((workload, container, found))

    def describe(found):
        kind, value = found
        return f"Secret {value[0]}, key {value[1]}" if kind == "secret" else "the same literal URL"

    def same(a, b):
        if a == b:
            return describe(a)
        if a[0] == b[0] == "secret":
            user = overlay.secret_user(a[1])
            if user and user == overlay.secret_user(b[1]):
                return f"PostgreSQL user {user}"
        return None

    pairs = [
        ("migrate", "serve", "serving must not hold the credential that owns the schema"),
        ("migrate", "verify", "verify reads only; it must not hold the schema owner's credential"),
        ("serve", "verify", "verify reads only; give it the read-only role"),
        ("migrate", "relay", "the relay writes its subscription's row only; give it the serving role"),
    ]
    for first, second, why in pairs:
        for w1, c1, a in credentials.get(first, []):
            for w2, c2, b in credentials.get(second, []):
                shared = same(a, b)
                if shared:
                    problems.append(
                        f"{ref(w1)} container {c1['name']} ({first}) and {ref(w2)} container "
                        f"{c2['name']} ({second}) connect with the same credential ({shared}): "
                        f"{why}; one Secret per role of deploy/sql/roles.sql"
                    )
    return problems


def check_network_policy(overlay):
    problems = []
    for workload, template, container in serving(overlay):
        labels = template["metadata"].get("labels", {})
        listen = overlay.env_value(container, "LISTEN_ADDR")
        grpc_port = port_of(listen) if listen else DEFAULT_LISTEN_PORT
        port_names = {p["containerPort"]: p.get("name") for p in container.get("ports", [])}
        for policy in overlay.of_kind("NetworkPolicy"):
            if not selects(policy["spec"].get("podSelector"), labels):
                continue
            if "Ingress" not in policy["spec"].get("policyTypes", ["Ingress"]):
                continue
            admitting = [
                rule for rule in policy["spec"].get("ingress", [])
                if not rule.get("ports") or any(
                    p.get("port") in (grpc_port, port_names.get(grpc_port)) for p in rule["ports"]
                )
            ]
            if not admitting:
                problems.append(
                    f"{ref(policy)} admits no caller to the gRPC port ({grpc_port}): the order "
                    f"service, watchers and admin sync need the label {CALLER_LABEL}"
                )
            for rule in admitting:
                peers = rule.get("from")
                if not peers:
                    problems.append(
                        f"{ref(policy)} admits every source to the gRPC port ({grpc_port}): "
                        f"admit callers by the label {CALLER_LABEL} on namespace and pods"
                    )
                    continue
                for peer in peers:
                    if selects_by_caller_label(peer.get("namespaceSelector")) and \
                            selects_by_caller_label(peer.get("podSelector")):
                        continue
                    problems.append(
                        f"{ref(policy)} admits gRPC ({grpc_port}) callers by "
                        f"{json.dumps(peer, sort_keys=True)}: admit them by the label "
                        f"{CALLER_LABEL} on both their namespace and their pods, which "
                        "docs/operations.md (\"Network policy\") tells every caller to carry; a "
                        "namespace or pod picked otherwise leaves callers blocked or undocumented"
                    )
    return problems


def alert_rules(overlay):
    for rule in overlay.of_kind("PrometheusRule"):
        for group in rule["spec"].get("groups", []):
            for item in group.get("rules", []):
                if "alert" in item:
                    yield rule, item


def check_verify_export(overlay):
    problems = []
    readers = [a["alert"] for _, a in alert_rules(overlay) if "inventory_verify_drift" in a["expr"]]
    if not readers:
        return problems
    for workload, template in overlay.workloads():
        for command, container in server_containers(template):
            if command != "verify":
                continue
            endpoint = next(
                (overlay.env_value(container, name) for name in OTLP_METRICS
                 if overlay.env_value(container, name)),
                None,
            )
            if not endpoint or overlay.env_value(container, "OTEL_SDK_DISABLED") == "true":
                problems.append(
                    f"{ref(workload)} exports nothing (no {' or '.join(OTLP_METRICS)} with a "
                    f"value), so {', '.join(readers)} on inventory_verify_drift can never fire: "
                    "point it at the server's collector"
                )
            attributes = overlay.env_value(container, "OTEL_RESOURCE_ATTRIBUTES") or ""
            if "k8s.namespace.name=" not in attributes:
                problems.append(
                    f"{ref(workload)} exports inventory_verify_drift without the resource "
                    "attribute k8s.namespace.name (OTEL_RESOURCE_ATTRIBUTES), which "
                    f"{', '.join(readers)} groups by"
                )
    return problems


def check_alert_selectors(overlay):
    problems = []
    rules = list(alert_rules(overlay))
    if not rules:
        return problems
    monitors = overlay.of_kind("PodMonitor")
    jobs = [f'{m["metadata"].get("namespace", "default")}/{m["metadata"]["name"]}' for m in monitors]
    if not any(re.search(r"absent\(\s*up\{", a["expr"]) for _, a in rules):
        problems.append(
            "no alert fires when no pod is scraped at all (absent(up{job=...})): if every pod "
            "crash-loops or stays Pending, every rate-based alert goes silent"
        )
    names = {
        "deployment": {d["metadata"]["name"] for d in overlay.of_kind("Deployment")},
        "cronjob": {d["metadata"]["name"] for d in overlay.of_kind("CronJob")},
    }
    for rule, alert in rules:
        where = f"{ref(rule)} alert {alert['alert']}"
        for matchers in re.findall(r"\bup\{([^}]*)\}", alert["expr"]):
            for operator, value in re.findall(r'\bjob\s*(=~|=)\s*"([^"]*)"', matchers):
                pattern = value if operator == "=~" else re.escape(value)
                if not any(re.fullmatch(pattern, job) for job in jobs):
                    problems.append(
                        f'{where}: up{{job{operator}"{value}"}} matches no PodMonitor\'s job '
                        f"({', '.join(jobs) or 'none rendered'})"
                    )
        for label, known in names.items():
            for value in re.findall(rf'\b{label}\s*=\s*"([^"]*)"', alert["expr"]):
                if value not in known:
                    problems.append(f'{where}: {label}="{value}" names no {label} of the overlay')
    return problems


OVERLAY_CHECKS = [
    check_tls_app_protocol,
    check_hpa_replicas,
    check_connections,
    check_credentials,
    check_network_policy,
    check_verify_export,
    check_alert_selectors,
]


def check_overlay(overlay):
    return [f"{overlay.name}: {p}" for check in OVERLAY_CHECKS for p in check(overlay)]


# ---------------------------------------------------------------------------------------
# The files beside the manifests.


def read_files():
    return {
        "dashboard": json.loads(DASHBOARD.read_text()),
        "roles": ROLES.read_text(),
        "dev_roles": DEV_ROLES.read_text(),
        "docs": DOCS.read_text(),
    }


def check_files(files):
    problems = []
    for variable in files["dashboard"].get("templating", {}).get("list", []):
        value = variable.get("allValue")
        if variable.get("includeAll") and (value is None or re.fullmatch(value, "")):
            problems.append(
                f"deploy/grafana/inventory.json: variable {variable['name']}'s All value "
                f"{json.dumps(value)} matches series without a {variable['name']} label "
                "(pushed over OTLP), which would count beside the scraped ones: use \".+\""
            )
    if files["dev_roles"] != files["roles"]:
        problems.append(
            "deploy/k8s/overlays/dev/initdb/10-roles.sql differs from deploy/sql/roles.sql: "
            "copy it again (kustomize reads no file outside the overlay)"
        )
    if CALLER_LABEL not in files["docs"]:
        problems.append(
            f"docs/operations.md does not name the label {CALLER_LABEL} the NetworkPolicy "
            "admits gRPC callers by: operators cannot know what to label"
        )
    return problems


def load(paths):
    overlays = []
    for path in paths:
        with open(path) as rendered:
            documents = [d for d in yaml.safe_load_all(rendered) if d]
        overlays.append(Overlay(Path(path).stem, documents))
    return overlays


def lint(overlays, files):
    return [p for o in overlays for p in check_overlay(o)] + check_files(files)


# ---------------------------------------------------------------------------------------
# The self-test: every defect put back must be caught.


def containers_named(overlay, kind, name):
    doc = overlay.find(kind, name)
    template = doc["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" \
        else doc["spec"]["template"]
    spec = template["spec"]
    return {c["name"]: c for c in spec.get("initContainers", []) + spec.get("containers", [])}


def set_env(container, name, entry):
    container["env"] = [e for e in container.get("env", []) if e["name"] != name]
    if entry is not None:
        container["env"].append({"name": name, **entry})


def secret(name):
    return {"valueFrom": {"secretKeyRef": {"name": name, "key": "url"}}}


def server_config(overlay):
    return next(c for c in overlay.of_kind("ConfigMap") if base_name(c["metadata"]["name"]) == "inventory-server")


def h2c_on_tls(o, f):
    for service in o.of_kind("Service"):
        if service["metadata"]["name"].startswith("inventory-server"):
            service["spec"]["ports"][0]["appProtocol"] = "kubernetes.io/h2c"


def replicas_beside_hpa(o, f):
    o.find("Deployment", "inventory-server")["spec"]["replicas"] = 3


def pool_too_large(o, f):
    server_config(o)["data"]["DATABASE_POOL_SIZE"] = "16"


def second_tenant(o, f):
    server_config(o)["data"]["TENANTS"] = "default,outlet"


def hpa_too_large(o, f):
    o.find("HorizontalPodAutoscaler", "inventory-server")["spec"]["maxReplicas"] = 20


def limits_undeclared(o, f):
    o.documents = [d for d in o.documents if not (
        d.get("kind") == "ConfigMap" and base_name(d["metadata"]["name"]) == LIMITS)]


def postgres_default_limit(o, f):
    o.find("StatefulSet", "postgres")["spec"]["template"]["spec"]["containers"][0].pop("args")


def migrate_shares_serving_secret(o, f):
    serve = containers_named(o, "Deployment", "inventory-server")["server"]
    url = next(e for e in serve["env"] if e["name"] == "DATABASE_URL")
    set_env(containers_named(o, "Deployment", "inventory-server")["migrate"], "DATABASE_URL",
            {k: v for k, v in url.items() if k != "name"})


def migrate_secret_with_serving_user(o, f):
    migrate = containers_named(o, "Deployment", "inventory-server")["migrate"]
    name = migrate["env"][0]["valueFrom"]["secretKeyRef"]["name"]
    url = "postgres://inventory_server:x@postgres:5432/inventory"
    o.find("Secret", name)["data"]["url"] = base64.b64encode(url.encode()).decode()


def verify_with_migrating_secret(o, f):
    migrate = containers_named(o, "Deployment", "inventory-server")["migrate"]
    name = next(e for e in migrate["env"] if e["name"] == "DATABASE_URL")["valueFrom"]["secretKeyRef"]["name"]
    set_env(containers_named(o, "CronJob", "inventory-verify")["verify"], "DATABASE_URL", secret(name))


def policy_by_namespace_name(o, f):
    policy = o.find("NetworkPolicy", "inventory-server")
    policy["spec"]["ingress"][0]["from"] = [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "orders"}}}]


def policy_admits_everyone(o, f):
    policy = o.find("NetworkPolicy", "inventory-server")
    policy["spec"]["ingress"][0].pop("from")


def verify_exports_nothing(o, f):
    verify = containers_named(o, "CronJob", "inventory-verify")["verify"]
    for name in OTLP_METRICS:
        set_env(verify, name, None)


def verify_without_namespace(o, f):
    set_env(containers_named(o, "CronJob", "inventory-verify")["verify"],
            "OTEL_RESOURCE_ATTRIBUTES", {"value": "k8s.cronjob.name=inventory-verify"})


def no_absent_alert(o, f):
    for rule in o.of_kind("PrometheusRule"):
        for group in rule["spec"]["groups"]:
            group["rules"] = [r for r in group["rules"] if "absent(" not in r.get("expr", "")]


def podmonitor_renamed(o, f):
    o.of_kind("PodMonitor")[0]["metadata"]["name"] = "inventory"


def relay_replicas_too_many(o, f):
    o.find("Deployment", "inventory-relay")["spec"]["replicas"] = 6


def relay_with_migrating_secret(o, f):
    migrate = containers_named(o, "Deployment", "inventory-server")["migrate"]
    name = next(e for e in migrate["env"] if e["name"] == "DATABASE_URL")["valueFrom"]["secretKeyRef"]["name"]
    set_env(containers_named(o, "Deployment", "inventory-relay")["relay"], "DATABASE_URL", secret(name))


def dashboard_all_matches_empty(o, f):
    for variable in f["dashboard"]["templating"]["list"]:
        if variable["name"] == "pod":
            variable["allValue"] = ".*"


def dev_roles_stale(o, f):
    f["dev_roles"] = f["dev_roles"].replace("GRANT SELECT ON ALL TABLES", "-- ")


def docs_without_label(o, f):
    f["docs"] = f["docs"].replace(CALLER_LABEL, "the caller label")


# (what is put back, the overlay it is put into (None: the files), a word of the message)
DEFECTS = [
    ("appProtocol h2c on the TLS gRPC port", "production", h2c_on_tls, "appProtocol kubernetes.io/h2c"),
    ("spec.replicas beside the HPA", "production", replicas_beside_hpa, "sets spec.replicas"),
    ("spec.replicas beside the HPA (dev)", "dev", replicas_beside_hpa, "sets spec.replicas"),
    ("DATABASE_POOL_SIZE 16 at 12 replicas", "production", pool_too_large, "above the database's max_connections"),
    ("HPA maximum of 20", "production", hpa_too_large, "above the database's max_connections"),
    ("a second tenant at the same pool", "production", second_tenant, "2 tenant(s)"),
    ("max_connections not declared", "production", limits_undeclared, "max_connections is not declared"),
    ("dev PostgreSQL at its default limit", "dev", postgres_default_limit, "default max_connections"),
    ("migrate and serve on one Secret", "production", migrate_shares_serving_secret, "(migrate) and Deployment/inventory-server container server (serve)"),
    ("migrate's Secret with the serving user", "dev", migrate_secret_with_serving_user, "same credential (PostgreSQL user inventory_server)"),
    ("verify on the migrating Secret", "production", verify_with_migrating_secret, "(verify) connect with the same credential"),
    ("6 relay replicas", "production-relay", relay_replicas_too_many, "Deployment/inventory-relay (6 replicas"),
    ("relay on the migrating Secret", "production-relay", relay_with_migrating_secret, "Deployment/inventory-relay container relay (relay) connect with the same credential"),
    ("gRPC admitted from namespace orders only", "production", policy_by_namespace_name, f"admit them by the label {CALLER_LABEL}"),
    ("gRPC admitted from everywhere", "production", policy_admits_everyone, "admits every source"),
    ("verify exporting nothing", "production", verify_exports_nothing, "can never fire"),
    ("verify exporting without its namespace", "production", verify_without_namespace, "k8s.namespace.name"),
    ("no absent(up) alert", "production", no_absent_alert, "absent(up{job=...})"),
    ("PodMonitor renamed under the up alerts", "production", podmonitor_renamed, "matches no PodMonitor's job"),
    ("dashboard All value .*", None, dashboard_all_matches_empty, "variable pod's All value"),
    ("dev roles.sql copy out of date", None, dev_roles_stale, "differs from deploy/sql/roles.sql"),
    ("caller label missing from the docs", None, docs_without_label, "does not name the label"),
]


def self_test(overlays, files):
    failures = []
    baseline = lint(overlays, files)
    if baseline:
        failures.append("the renderings as they are must pass first:\n  " + "\n  ".join(baseline))
    by_name = {o.name: o for o in overlays}
    for what, overlay_name, put_back, expected in DEFECTS:
        if overlay_name is not None and overlay_name not in by_name:
            failures.append(f"{what}: no rendered overlay {overlay_name!r} to put it into")
            continue
        mutated = copy.deepcopy(overlays)
        mutated_files = copy.deepcopy(files)
        target = next((o for o in mutated if o.name == overlay_name), None)
        put_back(target, mutated_files)
        # Only what the defect added counts: a message the renderings gave anyway is no catch.
        problems = [p for p in lint(mutated, mutated_files) if p not in baseline]
        caught = [p for p in problems if expected in p]
        if caught:
            print(f"self-test: {what}: caught: {caught[0]}")
        else:
            failures.append(
                f"{what}: not caught (expected a message with {expected!r}); got: {problems}")
    for failure in failures:
        print(f"error: self-test: {failure}", file=sys.stderr)
    if not failures:
        print(f"self-test: all {len(DEFECTS)} defects caught")
    return 1 if failures else 0


def main(argv):
    testing = argv[:1] == ["--self-test"]
    paths = argv[1:] if testing else argv
    if not paths:
        print(__doc__, file=sys.stderr)
        return 2
    overlays, files = load(paths), read_files()
    if testing:
        return self_test(overlays, files)
    problems = lint(overlays, files)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if not problems:
        print(f"lint-manifests: {', '.join(o.name for o in overlays)}: no defect found")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
