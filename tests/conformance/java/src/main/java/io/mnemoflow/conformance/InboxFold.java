package io.mnemoflow.conformance;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;

import org.apache.avro.generic.GenericRecord;

/** §6.4: the fold of one inbox partition, per session, exactly as the document's pseudo-code. */
final class InboxFold {
    static final int H = 1024;

    record Entry(String opId, String kind, String digest, long expiry, GenericRecord packet) {}

    record Dropped(String packetId, String why) {}

    static final class Session {
        final LinkedHashMap<String, Entry> pending = new LinkedHashMap<>();
        final LinkedHashSet<String> pendingDigests = new LinkedHashSet<>();
        final LinkedHashSet<String> steer = new LinkedHashSet<>();
        final LinkedHashMap<String, String> claimed = new LinkedHashMap<>();
        final LinkedHashSet<String> claimedDigests = new LinkedHashSet<>();
        final LinkedHashSet<String> applied = new LinkedHashSet<>();
        final List<Dropped> dropped = new ArrayList<>();

        boolean knows(String packetId) {
            if (pending.containsKey(packetId) || claimed.containsKey(packetId)) {
                return true;
            }
            for (Dropped d : dropped) {
                if (d.packetId().equals(packetId)) {
                    return true;
                }
            }
            return false;
        }
    }

    private final Map<String, Session> sessions = new HashMap<>();

    Session session(String sessionId) {
        return sessions.computeIfAbsent(sessionId, k -> new Session());
    }

    /** apply(op) of §6.4. */
    void apply(GenericRecord op) {
        Session s = session(Codec.str(op.get("sessionId")));
        String opId = Codec.str(op.get("opId"));
        if (s.applied.contains(opId)) {
            return;
        }
        s.applied.add(opId);
        if (s.applied.size() > 2 * H) {
            trimOldest(s.applied);
        }
        String kind = Codec.str(op.get("op"));
        switch (kind) {
            case "claim" -> {
                for (String id : strings(op.get("packetIds"))) {
                    Entry e = s.pending.remove(id);
                    if (e != null) {
                        s.pendingDigests.remove(e.digest());
                        s.claimed.put(id, opId);
                        s.claimedDigests.add(e.digest());
                    }
                    s.steer.remove(id);
                }
                if (s.claimed.size() > 2 * H) {
                    trimOldest(s.claimed.keySet());
                    if (s.claimedDigests.size() > 2 * H) {
                        trimOldest(s.claimedDigests);
                    }
                }
            }
            case "inject", "steer" -> {
                GenericRecord packet = (GenericRecord) op.get("packet");
                if (packet == null) {
                    return;
                }
                String id = Codec.str(packet.get("packetId"));
                String d = Codec.str(packet.get("exactDigest"));
                if (s.claimed.containsKey(id) || s.claimedDigests.contains(d)) {
                    s.dropped.add(new Dropped(id, "already-claimed"));
                } else if (s.pending.containsKey(id) || s.pendingDigests.contains(d)) {
                    s.dropped.add(new Dropped(id, "duplicate-pending"));
                } else {
                    s.pending.put(id, new Entry(opId, kind, d, (Long) packet.get("expiry"), packet));
                    s.pendingDigests.add(d);
                    if (kind.equals("steer")) {
                        s.steer.add(id);
                    }
                }
            }
            case "remove", "expire" -> {
                List<String> ids = strings(op.get("packetIds"));
                for (String id : ids) {
                    Entry e = s.pending.remove(id);
                    if (e != null) {
                        s.pendingDigests.remove(e.digest());
                    }
                    s.steer.remove(id);
                }
                List<String> sorted = new ArrayList<>(ids);
                Collections.sort(sorted);
                for (String id : sorted) {
                    s.dropped.add(new Dropped(id, kind));
                }
            }
            default -> {
                // an op kind this host does not know: the schema has none other
            }
        }
        if (s.dropped.size() > 2 * H) {
            s.dropped.subList(0, s.dropped.size() - H).clear();
        }
    }

    static List<String> strings(Object avroArray) {
        List<String> out = new ArrayList<>();
        if (avroArray instanceof Iterable<?> it) {
            for (Object o : it) {
                out.add(Codec.str(o));
            }
        }
        return out;
    }

    /** Keep only the newest H of an insertion-ordered collection. */
    private static void trimOldest(java.util.Set<String> set) {
        Iterator<String> it = set.iterator();
        int excess = set.size() - H;
        while (excess-- > 0 && it.hasNext()) {
            it.next();
            it.remove();
        }
    }
}
