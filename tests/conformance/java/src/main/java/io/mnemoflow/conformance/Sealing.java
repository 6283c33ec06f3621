package io.mnemoflow.conformance;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import javax.crypto.Cipher;
import javax.crypto.spec.GCMParameterSpec;
import javax.crypto.spec.SecretKeySpec;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.Schema;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * §13 Sealing: the memory-keys topic folded, data keys unwrapped with the KEK, and packet items
 * opened. Written from the document: AES-256-GCM with a 128-bit tag (javax.crypto), associated
 * data as §13 gives it.
 */
final class Sealing implements AutoCloseable {
    private static final ObjectMapper JSON = new ObjectMapper();

    private final byte[] kek;
    private final String kekId;
    private final KafkaConsumer<byte[], byte[]> consumer;
    private final TopicPartition tp;
    private final Map<String, GenericRecord> keys = new HashMap<>(); // record key -> OwnerKey
    private final Set<String> shredded = new HashSet<>();
    int shreddedItems = 0;

    Sealing(String bootstrap, String topic, Path kekFile) throws Exception {
        kek = Files.readAllBytes(kekFile);
        if (kek.length != 32) {
            throw new IllegalArgumentException(kekFile + " is not a 32-byte key-encryption key");
        }
        MessageDigest sha = MessageDigest.getInstance("SHA-256");
        sha.update("mnemoflow-kek-id".getBytes(StandardCharsets.UTF_8));
        kekId = Protocol.hex(sha.digest(kek)).substring(0, 16);
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        consumer = new KafkaConsumer<>(p);
        tp = new TopicPartition(topic, 0);
        consumer.assign(List.of(tp));
        consumer.seekToBeginning(List.of(tp));
        catchUp();
    }

    /** Fold memory-keys to its end as of now (§13, "Folding the topic"). */
    void catchUp() throws Exception {
        long end = consumer.endOffsets(List.of(tp)).get(tp);
        while (consumer.position(tp) < end) {
            for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                if (r.key() == null) {
                    continue;
                }
                String rk = new String(r.key(), StandardCharsets.UTF_8);
                if (r.value() == null) {
                    keys.remove(rk);
                    shredded.add(rk);
                    continue;
                }
                GenericRecord v = Codec.decode(Codec.OWNER_KEY, r.value());
                if (Codec.str(v.get("kind")).equals("key") && !shredded.contains(rk)) {
                    keys.put(rk, v);
                }
            }
        }
    }

    private byte[] dataKey(String keyId) throws Exception {
        GenericRecord v = keys.get(keyId);
        if (v == null && !shredded.contains(keyId)) {
            catchUp(); // a key is on the topic before anything sealed with it
            v = keys.get(keyId);
        }
        if (v == null) {
            return null; // shredded: the owner was forgotten
        }
        if (!Codec.str(v.get("kekId")).equals(kekId)) {
            throw new IllegalStateException("key " + keyId + " was wrapped by another KEK");
        }
        ByteBuffer b = ((ByteBuffer) v.get("wrappedKey")).duplicate();
        byte[] wrapped = new byte[b.remaining()];
        b.get(wrapped);
        return gcm(kek, java.util.Arrays.copyOfRange(wrapped, 0, 12),
                java.util.Arrays.copyOfRange(wrapped, 12, wrapped.length), keyId.getBytes(StandardCharsets.UTF_8));
    }

    static byte[] gcm(byte[] key, byte[] nonce, byte[] ciphertext, byte[] aad) throws Exception {
        Cipher c = Cipher.getInstance("AES/GCM/NoPadding");
        c.init(Cipher.DECRYPT_MODE, new SecretKeySpec(key, "AES"), new GCMParameterSpec(128, nonce));
        c.updateAAD(aad);
        return c.doFinal(ciphertext);
    }

    /** The packet with its items in the clear; an item whose key is shredded is left out. */
    GenericRecord openPacket(GenericRecord packet) throws Exception {
        List<Object> items = new ArrayList<>();
        Schema itemSchema = null;
        for (Object o : (Collection<?>) packet.get("items")) {
            GenericRecord item = (GenericRecord) o;
            itemSchema = item.getSchema();
            GenericRecord sealed = (GenericRecord) item.get("sealed");
            if (sealed == null) {
                items.add(item);
                continue;
            }
            byte[] key = dataKey(Codec.str(sealed.get("keyId")));
            if (key == null) {
                shreddedItems++;
                continue;
            }
            byte[] aad = ("item\0" + Codec.str(item.get("memoryId")) + "\0" + Codec.str(item.get("owner")))
                    .getBytes(StandardCharsets.UTF_8);
            byte[] plain = gcm(key, Base64.getDecoder().decode(Codec.str(sealed.get("nonce"))),
                    Base64.getDecoder().decode(Codec.str(sealed.get("ciphertext"))), aad);
            JsonNode fields = JSON.readTree(plain);
            GenericData.Record open = new GenericData.Record(itemSchema);
            for (Schema.Field f : itemSchema.getFields()) {
                open.put(f.name(), item.get(f.name()));
            }
            open.put("text", fields.get("text").asText());
            open.put("digest", fields.get("digest").asText());
            open.put("sealed", null);
            items.add(open);
        }
        GenericData.Record out = new GenericData.Record(packet.getSchema());
        for (Schema.Field f : packet.getSchema().getFields()) {
            out.put(f.name(), packet.get(f.name()));
        }
        out.put("items", items);
        return out;
    }

    @Override
    public void close() {
        consumer.close();
    }
}
