"""Helpers of scripts/chart-check (run with the Python of its kubernetes-validate virtualenv,
which brings PyYAML).

  chart_check.py crd-schemas OUT CRD.yaml...
      each version of each CustomResourceDefinition as a strict JSON schema,
      OUT/<group>/<kind>_<version>.json (kubeconform's schema-location layout): objects
      with declared properties admit no other (unless x-kubernetes-preserve-unknown-fields),
      x-kubernetes-int-or-string becomes integer-or-string
  chart_check.py rules RENDERED.yaml OUT.yml
      the groups of the rendered PrometheusRule(s) as a Prometheus rules file (for promtool)
  chart_check.py agree RENDERED.yaml VALUES.yaml[,VALUES.yaml] PLAN.yaml ACL_PLAN.txt ROLES.txt
      the rendered chart against its sources: KafkaTopics = the chart's topic plan with the
      values' partitions, replication and min.insync.replicas; KafkaUsers' ACLs = the lines of
      `scripts/stack secure acl-plan`, binding for binding; no service user may create topics
      and the broker creates none by itself; the CloudNativePG managed roles and Databases =
      the roles the local stack's PostgreSQL has (ROLES.txt: name|login|groups, from psql);
      no Secret object and no literal value for a variable named *TOKEN*, *PASSWORD* or *SECRET*
"""
import json
import os
import sys

import yaml


class Loader(yaml.SafeLoader):
    """PyYAML reads a bare `=` as the obsolete `value` type (some CRDs have `- =` in enums)."""


Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def load_all(path):
    with open(path) as f:
        return [doc for doc in yaml.load_all(f, Loader=Loader) if doc]


def strict(schema):
    """kubeconform's -strict for CRDs: what the schema does not declare is an error."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    preserve = out.get("x-kubernetes-preserve-unknown-fields") is True
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    return out


def crd_schemas(out_dir, paths):
    written = 0
    for path in paths:
        for crd in load_all(path):
            if crd.get("kind") != "CustomResourceDefinition":
                continue
            group = crd["spec"]["group"]
            kind = crd["spec"]["names"]["kind"].lower()
            for version in crd["spec"]["versions"]:
                schema = (version.get("schema") or {}).get("openAPIV3Schema")
                if schema is None:
                    continue
                schema = strict(schema)
                # apiVersion, kind and metadata are the API server's; kubeconform checks them
                schema.setdefault("properties", {})
                os.makedirs(os.path.join(out_dir, group), exist_ok=True)
                target = os.path.join(out_dir, group, f"{kind}_{version['name']}.json")
                with open(target, "w") as f:
                    json.dump(schema, f)
                written += 1
    print(f"{written} schema(s) written to {out_dir}")
    if written == 0:
        sys.exit("no CustomResourceDefinition schema found")


def rules(rendered, out):
    groups = []
    for doc in load_all(rendered):
        if doc.get("kind") == "PrometheusRule":
            groups.extend(doc["spec"]["groups"])
    if not groups:
        sys.exit("no PrometheusRule in the rendered chart")
    with open(out, "w") as f:
        yaml.safe_dump({"groups": groups}, f, sort_keys=False)
    print(f"{sum(len(g['rules']) for g in groups)} rule(s) in {len(groups)} group(s)")


RESOURCE = {"topic": "TOPIC", "group": "GROUP", "transactionalId": "TRANSACTIONAL_ID", "cluster": "CLUSTER"}
PATTERN = {"literal": "LITERAL", "prefix": "PREFIXED"}


def operation(name):
    """Strimzi's DescribeConfigs is Kafka's DESCRIBE_CONFIGS."""
    out = ""
    for i, ch in enumerate(name):
        if ch.isupper() and i > 0:
            out += "_"
        out += ch.upper()
    return out


def merge(base, override):
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge(base[key], value)
        else:
            base[key] = value


def agree(rendered, values_path, plan_path, acl_plan_path, roles_path):
    docs = load_all(rendered)
    values = {}
    for path in values_path.split(","):  # the chart's values.yaml, then the value set, merged as Helm does
        with open(path) as f:
            merge(values, yaml.safe_load(f) or {})
    with open(plan_path) as f:
        plan = yaml.safe_load(f)
    failures = []
    by_kind = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)

    # topics: the plan's, with the values' partitions and replication
    partitions = values["kafka"]["partitions"]
    replicas = values["kafka"]["replicas"]
    expected = {
        t["name"]: (partitions, replicas, {"retention.ms": t["retentionMs"], "min.insync.replicas": min(2, replicas)})
        for t in plan["topics"]
    }
    actual = {}
    for topic in by_kind.get("KafkaTopic", []):
        spec = topic["spec"]
        actual[spec["topicName"]] = (spec["partitions"], spec["replicas"], spec.get("config", {}))
    if actual != expected:
        for name in sorted(set(actual) | set(expected)):
            if actual.get(name) != expected.get(name):
                failures.append(f"KafkaTopic {name}: rendered {actual.get(name)}, expected {expected.get(name)}")

    # ACLs: binding for binding what scripts/stack secure grants
    with open(acl_plan_path) as f:
        stack_acls = sorted(tuple(line.split()) for line in f if line.strip())
    chart_acls = []
    for user in by_kind.get("KafkaUser", []):
        name = user["metadata"]["name"]
        if user["spec"]["authentication"]["type"] != "scram-sha-512":
            failures.append(f"KafkaUser {name}: authentication is not scram-sha-512")
        for acl in user["spec"]["authorization"]["acls"]:
            resource = acl["resource"]
            for op in acl["operations"]:
                chart_acls.append(
                    (name, RESOURCE[resource["type"]], PATTERN[resource["patternType"]], resource["name"], operation(op))
                )
                if op in ("Create", "All", "Alter") and name != values["strimzi"]["operatorUser"]:
                    failures.append(f"KafkaUser {name} may {op} {resource['name']}: only the operator user creates topics")
    chart_acls.sort()
    if chart_acls != stack_acls:
        for binding in sorted(set(chart_acls) - set(stack_acls)):
            failures.append(f"ACL in the chart, not in scripts/stack secure: {' '.join(binding)}")
        for binding in sorted(set(stack_acls) - set(chart_acls)):
            failures.append(f"ACL in scripts/stack secure, not in the chart: {' '.join(binding)}")
        if len(chart_acls) != len(stack_acls):
            failures.append(f"{len(chart_acls)} ACL bindings in the chart, {len(stack_acls)} in scripts/stack secure")
    service_users = {u["username"] for u in values["kafka"]["users"].values()}
    kafka_users = {u["metadata"]["name"] for u in by_kind.get("KafkaUser", [])}
    if kafka_users != service_users | {values["strimzi"]["operatorUser"]}:
        failures.append(f"KafkaUsers {sorted(kafka_users)} are not the services' users {sorted(service_users)} + the operator user")
    for kafka in by_kind.get("Kafka", []):
        if kafka["spec"]["kafka"]["config"].get("auto.create.topics.enable") is not False:
            failures.append("Kafka: auto.create.topics.enable is not false")

    # PostgreSQL roles: the local stack's (scripts/stack.d/postgres.sh), login and membership
    with open(roles_path) as f:
        stack_roles = {}
        for line in f:
            if line.strip():
                name, login, groups = line.rstrip("\n").split("|")
                stack_roles[name] = (login == "t", tuple(sorted(g for g in groups.split(",") if g)))
    for cluster in by_kind.get("Cluster", []):
        chart_roles = {
            r["name"]: (r.get("login", False), tuple(sorted(r.get("inRoles", []))))
            for r in cluster["spec"]["managed"]["roles"]
        }
        if chart_roles != stack_roles:
            failures.append(f"CloudNativePG roles {chart_roles} differ from the stack's {stack_roles}")
    owners = {d["spec"]["name"]: d["spec"]["owner"] for d in by_kind.get("Database", [])}
    if by_kind.get("Cluster") and owners != {"transferencias": "transferencias", "ledger": "ledger"}:
        failures.append(f"CloudNativePG Databases {owners}: expected transferencias and ledger, each owned by its role")

    # secrets only by reference: no Secret object, no literal value for a secret variable
    for doc in docs:
        if doc["kind"] == "Secret":
            failures.append(f"Secret {doc['metadata']['name']} rendered: the chart only names Secrets (existingSecret)")
        pod = (doc.get("spec", {}).get("template") or {}).get("spec") or {}
        for container in pod.get("containers", []):
            for env in container.get("env", []):
                secret_like = any(word in env["name"] for word in ("TOKEN", "PASSWORD", "SECRET"))
                if secret_like and "value" in env:
                    failures.append(f"{doc['kind']} {doc['metadata']['name']}: {env['name']} has a literal value")
                if env["name"].endswith("DATABASE_URL") and "$(" not in env.get("value", "$("):
                    failures.append(f"{doc['kind']} {doc['metadata']['name']}: {env['name']} holds no $(VAR) password reference")

    if failures:
        print("\n".join(failures))
        sys.exit(1)
    print(
        f"{len(actual)} topics, {len(chart_acls)} ACL bindings of {len(kafka_users)} users"
        + (f", {len(stack_roles)} roles and {len(owners)} databases" if by_kind.get("Cluster") else "")
        + " agree"
    )


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "crd-schemas":
        crd_schemas(args[0], args[1:])
    elif command == "rules":
        rules(*args)
    elif command == "agree":
        agree(*args)
    else:
        sys.exit(__doc__)
