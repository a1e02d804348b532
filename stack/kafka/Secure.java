// The secure broker's users and ACLs (scripts/stack secure …), through the Admin API as the
// super user; run with Java's single-file source launcher and the Kafka jars on the class path.
//
//   Secure ready ADMIN.properties            exit 0 once the broker answers the super user
//   Secure users ADMIN.properties NAME=PASSWORD…
//                                            create or update SCRAM-SHA-512 credentials
//   Secure acls ADMIN.properties PREFIX      the least-privilege ACLs of every service for the
//                                            topics, groups and transactional ids behind PREFIX
//                                            ("" = the production names); idempotent
//   Secure show ADMIN.properties             print every ACL binding
//   Secure plan PREFIX                       print the ACLs `acls` would create, one a line
//                                            (user resource-type pattern-type name operation),
//                                            without a broker: what the Helm chart's KafkaUsers
//                                            are checked against (scripts/chart-check)
//
// The ACL table is the one docs/operations.md ("Production checklist") gives operators; keep
// the two in step. Topic names follow CONTRACT.md §3 (crates/contracts/src/topics.rs).
import java.io.FileInputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ScramCredentialInfo;
import org.apache.kafka.clients.admin.ScramMechanism;
import org.apache.kafka.clients.admin.UserScramCredentialAlteration;
import org.apache.kafka.clients.admin.UserScramCredentialUpsertion;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourceType;

public class Secure {
    static final String[] RETRY_DELAYS = {"1000", "2000", "4000"};
    static final String SOLICITADA = "transferencias.solicitada";
    static final String ANALISADA = "transferencias.analisada";
    static final String REJEITADA = "transferencias.rejeitada";
    static final String LIQUIDADA = "transferencias.liquidada";

    public static void main(String[] args) throws Exception {
        if (args.length == 2 && args[0].equals("plan")) {
            for (AclBinding acl : acls(args[1])) {
                System.out.println(acl.entry().principal().substring("User:".length()) + " "
                    + acl.pattern().resourceType() + " " + acl.pattern().patternType() + " "
                    + acl.pattern().name() + " " + acl.entry().operation());
            }
            return;
        }
        if (args.length < 2) {
            System.err.println("usage: Secure ready|users|acls|show ADMIN.properties [...] | Secure plan PREFIX");
            System.exit(2);
        }
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[1])) {
            props.load(in);
        }
        props.putIfAbsent("request.timeout.ms", "5000");
        props.putIfAbsent("default.api.timeout.ms", "10000");
        try (Admin admin = Admin.create(props)) {
            switch (args[0]) {
                case "ready" -> {
                    int brokers = admin.describeCluster().nodes().get(10, TimeUnit.SECONDS).size();
                    System.out.println(brokers + " broker(s)");
                }
                case "users" -> {
                    List<UserScramCredentialAlteration> upserts = new ArrayList<>();
                    for (int i = 2; i < args.length; i++) {
                        String[] user = args[i].split("=", 2);
                        upserts.add(new UserScramCredentialUpsertion(user[0],
                            new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), user[1]));
                    }
                    admin.alterUserScramCredentials(upserts).all().get(30, TimeUnit.SECONDS);
                    System.out.println(upserts.size() + " SCRAM user(s) up to date");
                }
                case "acls" -> {
                    String prefix = args.length > 2 ? args[2] : "";
                    List<AclBinding> acls = acls(prefix);
                    admin.createAcls(acls).all().get(30, TimeUnit.SECONDS);
                    System.out.println(acls.size() + " ACL binding(s) for prefix '" + prefix + "'");
                }
                case "show" -> {
                    for (AclBinding acl : admin.describeAcls(AclBindingFilter.ANY).values().get(30, TimeUnit.SECONDS)) {
                        System.out.println(acl);
                    }
                }
                default -> {
                    System.err.println("unknown command " + args[0]);
                    System.exit(2);
                }
            }
        } catch (Exception e) {
            System.err.println(args[0] + " failed: " + e);
            System.exit(1);
        }
    }

    /** Every service's ACLs for the names behind {@code p}. */
    static List<AclBinding> acls(String p) {
        List<AclBinding> acls = new ArrayList<>();
        // every service checks the topic plan at start (metadata and configurations only)
        for (String service : new String[] {"transferencias", "antifraude", "ledger", "notificacoes"}) {
            allow(acls, service, ResourceType.TOPIC, PatternType.PREFIXED, p + "transferencias.",
                AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS);
        }
        // transferencias: its outbox writes solicitada; its projection reads the outcomes and
        // dead-letters what it cannot read
        topic(acls, "transferencias", p + SOLICITADA, AclOperation.WRITE);
        topic(acls, "transferencias", p + LIQUIDADA, AclOperation.READ);
        topic(acls, "transferencias", p + REJEITADA, AclOperation.READ);
        topic(acls, "transferencias", p + LIQUIDADA + "-dlt", AclOperation.WRITE);
        topic(acls, "transferencias", p + REJEITADA + "-dlt", AclOperation.WRITE);
        group(acls, "transferencias", p + "transferencias-projecao", AclOperation.READ);
        // antifraude: reads solicitada, writes its decisions and dead letters in transactions
        topic(acls, "antifraude", p + SOLICITADA, AclOperation.READ);
        topic(acls, "antifraude", p + ANALISADA, AclOperation.WRITE);
        topic(acls, "antifraude", p + REJEITADA, AclOperation.WRITE);
        topic(acls, "antifraude", p + SOLICITADA + "-dlt", AclOperation.WRITE);
        group(acls, "antifraude", p + "antifraude", AclOperation.READ);
        allow(acls, "antifraude", ResourceType.TRANSACTIONAL_ID, PatternType.PREFIXED, p + "tx-antifraude-",
            AclOperation.WRITE, AclOperation.DESCRIBE);
        // ledger: reads analisada, its outbox writes the outcomes
        topic(acls, "ledger", p + ANALISADA, AclOperation.READ);
        topic(acls, "ledger", p + LIQUIDADA, AclOperation.WRITE);
        topic(acls, "ledger", p + REJEITADA, AclOperation.WRITE);
        topic(acls, "ledger", p + ANALISADA + "-dlt", AclOperation.WRITE);
        group(acls, "ledger", p + "ledger", AclOperation.READ);
        // notificacoes: reads the outcomes and its retry topics, writes retries and dead letters
        for (String source : new String[] {LIQUIDADA, REJEITADA}) {
            topic(acls, "notificacoes", p + source, AclOperation.READ);
            for (String delay : RETRY_DELAYS) {
                topic(acls, "notificacoes", p + source + "-retry-" + delay, AclOperation.READ);
                topic(acls, "notificacoes", p + source + "-retry-" + delay, AclOperation.WRITE);
            }
            topic(acls, "notificacoes", p + source + "-dlt", AclOperation.WRITE);
        }
        group(acls, "notificacoes", p + "notificacoes", AclOperation.READ);
        for (String delay : RETRY_DELAYS) {
            group(acls, "notificacoes", p + "notificacoes-retry-" + delay, AclOperation.READ);
        }
        // NOTIFICACOES_CONSUMPTION=share-group: its share group, whose delivery-count limit and
        // start offset it sets at start (IncrementalAlterConfigs on the group)
        group(acls, "notificacoes", p + "notificacoes-share", AclOperation.READ);
        group(acls, "notificacoes", p + "notificacoes-share", AclOperation.ALTER_CONFIGS);
        // the dead-letter gauge reads the replay progress of the topics each service dead-letters to
        for (String service : new String[] {"transferencias", "antifraude", "ledger", "notificacoes"}) {
            group(acls, service, p + "pagamentos-dlt-replay", AclOperation.DESCRIBE);
        }
        // operador: `pagamentos topics` (create, verify), `dlt list|replay`, `loadgen`
        allow(acls, "operador", ResourceType.TOPIC, PatternType.PREFIXED, p + "transferencias.",
            AclOperation.CREATE, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
            AclOperation.READ, AclOperation.WRITE);
        allow(acls, "operador", ResourceType.GROUP, PatternType.PREFIXED, p + "pagamentos-", AclOperation.READ);
        return acls;
    }

    static void topic(List<AclBinding> acls, String user, String name, AclOperation operation) {
        allow(acls, user, ResourceType.TOPIC, PatternType.LITERAL, name, operation);
    }

    static void group(List<AclBinding> acls, String user, String name, AclOperation operation) {
        allow(acls, user, ResourceType.GROUP, PatternType.LITERAL, name, operation);
    }

    static void allow(List<AclBinding> acls, String user, ResourceType type, PatternType pattern, String name,
                      AclOperation... operations) {
        for (AclOperation operation : operations) {
            acls.add(new AclBinding(new ResourcePattern(type, name, pattern),
                new AccessControlEntry("User:" + user, "*", operation, AclPermissionType.ALLOW)));
        }
    }
}
