package io.mnemoflow.conformance;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

import org.apache.avro.Schema;
import org.apache.avro.SchemaNormalization;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;

/**
 * §4 Avro single-object encoding, with the Parsing Canonical Forms of Appendix B (copied into
 * src/main/resources/pcf/) as writer and reader schemas. The frame is written and checked by
 * hand, as the document describes it; Avro's own BinaryMessageEncoder is used only by the
 * self-test, to cross-check.
 */
final class Codec {
    private Codec() {}

    /** One schema this host knows: its PCF text, parsed schema and CRC-64-AVRO fingerprint. */
    record Known(String fullName, String pcf, Schema schema, long fingerprint) {}

    static final String SESSION_EVENT = "io.mnemoflow.SessionEvent";
    static final String TOOL_RESULT = "io.mnemoflow.ToolResult";
    static final String AGENT_STEP = "io.mnemoflow.AgentStep";
    static final String INBOX_OP = "io.mnemoflow.InboxOp";
    static final String AUDIT_RECORD = "io.mnemoflow.AuditRecord";
    static final String DEAD_LETTER = "io.mnemoflow.DeadLetter";
    static final String OWNER_KEY = "io.mnemoflow.OwnerKey";

    static final Map<String, Known> BY_NAME = new LinkedHashMap<>();
    static final Map<Long, Known> BY_FINGERPRINT = new LinkedHashMap<>();

    static {
        for (String n : new String[] {"SessionEvent", "ToolResult", "AgentStep", "InboxOp", "AuditRecord",
                "DeadLetter", "OwnerKey"}) {
            String pcf = resource("/pcf/" + n + ".json").strip();
            Schema schema = new Schema.Parser().parse(pcf);
            long fp = Protocol.crc64Avro(pcf.getBytes(StandardCharsets.UTF_8));
            Known k = new Known(schema.getFullName(), pcf, schema, fp);
            BY_NAME.put(k.fullName(), k);
            BY_FINGERPRINT.put(fp, k);
        }
    }

    static Known known(String fullName) {
        Known k = BY_NAME.get(fullName);
        if (k == null) {
            throw new IllegalArgumentException("no schema " + fullName);
        }
        return k;
    }

    static Schema schema(String fullName) {
        return known(fullName).schema();
    }

    /** Avro's own view of the PCF and fingerprint, for the self-test. */
    static String avroPcf(String fullName) {
        return SchemaNormalization.toParsingForm(schema(fullName));
    }

    static long avroFingerprint(String fullName) {
        return SchemaNormalization.parsingFingerprint64(schema(fullName));
    }

    /** C3 01, the fingerprint little-endian, the Avro binary body; nothing after it. */
    static byte[] encode(GenericRecord rec) {
        Known k = known(rec.getSchema().getFullName());
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.write(0xC3);
        out.write(0x01);
        long fp = k.fingerprint();
        for (int i = 0; i < 8; i++) {
            out.write((int) (fp >>> (8 * i)) & 0xff);
        }
        try {
            BinaryEncoder enc = EncoderFactory.get().directBinaryEncoder(out, null);
            new GenericDatumWriter<GenericRecord>(k.schema()).write(rec, enc);
            enc.flush();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        return out.toByteArray();
    }

    /** A value that is not a record of the expected type, with the §4 reason. */
    static final class Undecodable extends Exception {
        final String reason;

        Undecodable(String reason, String detail) {
            super(reason + ": " + detail);
            this.reason = reason;
        }
    }

    /** §4 "What a reader accepts", in its order, against the schemas this host knows. */
    static GenericRecord decode(String expectedFullName, byte[] value) throws Undecodable {
        if (value == null || value.length < 10 || (value[0] & 0xff) != 0xC3 || (value[1] & 0xff) != 0x01) {
            throw new Undecodable("bad-magic", "no C3 01 frame");
        }
        long fp = 0;
        for (int i = 0; i < 8; i++) {
            fp |= (value[2 + i] & 0xffL) << (8 * i);
        }
        Known k = BY_FINGERPRINT.get(fp);
        if (k == null) {
            throw new Undecodable("unknown-fingerprint", Long.toHexString(fp));
        }
        if (!k.fullName().equals(expectedFullName)) {
            throw new Undecodable("wrong-type", k.fullName());
        }
        try {
            BinaryDecoder dec = DecoderFactory.get().binaryDecoder(value, 10, value.length - 10, null);
            GenericRecord rec = new GenericDatumReader<GenericRecord>(k.schema()).read(null, dec);
            if (!dec.isEnd()) {
                throw new Undecodable("undecodable", "bytes left after the record");
            }
            return rec;
        } catch (IOException | RuntimeException e) {
            throw new Undecodable("undecodable", String.valueOf(e));
        }
    }

    static GenericData.Record record(String fullName) {
        return new GenericData.Record(schema(fullName));
    }

    /** The record schema of a ["null", record] union field. */
    static Schema unionRecord(Schema owner, String field) {
        for (Schema s : owner.getField(field).schema().getTypes()) {
            if (s.getType() == Schema.Type.RECORD) {
                return s;
            }
        }
        throw new IllegalArgumentException(field);
    }

    static GenericData.EnumSymbol symbol(Schema owner, String field, String symbol) {
        Schema s = owner.getField(field).schema();
        if (!s.getEnumSymbols().contains(symbol)) {
            throw new IllegalArgumentException(field + " has no symbol " + symbol);
        }
        return new GenericData.EnumSymbol(s, symbol);
    }

    /** A decoded string (Avro gives Utf8) or null. */
    static String str(Object o) {
        return o == null ? null : o.toString();
    }

    private static String resource(String path) {
        try (InputStream in = Codec.class.getResourceAsStream(path)) {
            if (in == null) {
                throw new IllegalStateException("missing resource " + path);
            }
            return new String(in.readAllBytes(), StandardCharsets.UTF_8);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
