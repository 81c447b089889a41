"""Splits rendered manifests for `make lint`: Prometheus Operator kinds apart from the rest.

Reads a kustomize rendering on stdin and writes the documents Kubernetes itself knows to
stdout (for kubernetes-validate). Each PrometheusRule's rule groups go to the file named by
the first argument, for promtool, which checks the alert expressions themselves. A
PodMonitor must select the pods by the label they carry and name a port they declare; that
is checked here, since no offline schema of the operator's kinds is at hand.
"""

import sys

import yaml

OPERATOR = "monitoring.coreos.com/"


def main(rules_path: str) -> int:
    documents = [d for d in yaml.safe_load_all(sys.stdin) if d]
    plain, groups, problems = [], [], []
    pod_ports, pod_labels = set(), []
    for doc in documents:
        if doc.get("kind") == "Deployment":
            template = doc["spec"]["template"]
            pod_labels.append(template["metadata"].get("labels", {}))
            for container in template["spec"]["containers"]:
                pod_ports.update(p.get("name") for p in container.get("ports", []))
    for doc in documents:
        api = doc.get("apiVersion", "")
        if not api.startswith(OPERATOR):
            plain.append(doc)
            continue
        name = f'{doc["kind"]}/{doc["metadata"]["name"]}'
        if doc["kind"] == "PrometheusRule":
            groups.extend(doc["spec"]["groups"])
        elif doc["kind"] == "PodMonitor":
            selector = doc["spec"]["selector"].get("matchLabels", {})
            if not any(selector.items() <= labels.items() for labels in pod_labels):
                problems.append(f"{name}: selector {selector} matches no Deployment's pods")
            for endpoint in doc["spec"]["podMetricsEndpoints"]:
                if endpoint.get("port") not in pod_ports:
                    problems.append(f'{name}: port {endpoint.get("port")!r} is not declared by the pods')
        else:
            problems.append(f"{name}: unexpected kind")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    with open(rules_path, "w") as rules:
        yaml.safe_dump({"groups": groups}, rules, sort_keys=False)
    yaml.safe_dump_all(plain, sys.stdout, sort_keys=False)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
